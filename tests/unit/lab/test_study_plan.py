"""What a study trains stage by stage (lab/study_plan.py), and the one command that runs it to the end."""

from itertools import product

import pytest

from lab.run_study import commands, split_axes
from lab.study_plan import (
    Job,
    StudyPlan,
    best_rate,
    half_decade,
    next_jobs,
    next_rate,
    on_grid,
    planned_runs,
    report_seeds,
)

RATES = [1e-3, 3e-3, 1e-2]
# "base" is compared by a claim: 3 selection seeds; "other" 1; every variant then 2 report seeds.
PLAN = StudyPlan(headline=["base"], headline_seeds=3, selection_seeds=1, report_seeds=2, extra_rates=2)
REPORT = [3, 4]  # after every variant's selection seeds, the same for all


def test_half_decades_step_the_1_3_10_grid():
    assert half_decade(3e-4, up=False) == 1e-4 and half_decade(3e-4, up=True) == 1e-3
    assert half_decade(1e-3, up=False) == 3e-4 and half_decade(1e-1, up=True) == 3e-1
    with pytest.raises(ValueError, match="not 1 or 3 times a power of ten"):
        half_decade(2e-3, up=True)


def test_the_grid_comes_first_with_the_headline_seeds():
    assert next_jobs(PLAN, "other", RATES, {}) == [Job("other", lr, 0) for lr in RATES]
    assert len(next_jobs(PLAN, "base", RATES, {})) == 3 * 3
    half_done = {(lr, 0): 5.0 for lr in RATES}
    assert {j.seed for j in next_jobs(PLAN, "base", RATES, half_done)} == {1, 2}


def test_an_interior_best_rate_gets_the_report_seeds_which_never_chose_it():
    assert report_seeds(PLAN) == REPORT
    losses = {(1e-3, 0): 5.2, (3e-3, 0): 4.9, (1e-2, 0): 5.1}
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 3e-3, s) for s in REPORT]
    losses.update({(3e-3, s): 4.9 for s in REPORT})
    assert next_jobs(PLAN, "other", RATES, losses) == []
    base = {(lr, s): loss for s in range(3) for lr, loss in zip(RATES, (5.0, 4.9, 5.1))}
    assert next_jobs(PLAN, "base", RATES, base) == [Job("base", 3e-3, s) for s in REPORT]


def test_a_new_edition_runs_fresh_seeds_from_its_first_seed():
    later = StudyPlan(headline=["base"], headline_seeds=3, selection_seeds=1, report_seeds=2, first_seed=10)
    assert {j.seed for j in next_jobs(later, "base", RATES, {})} == {10, 11, 12}
    assert {j.seed for j in next_jobs(later, "other", RATES, {})} == {10}
    assert report_seeds(later) == [13, 14]


def test_a_best_rate_at_an_edge_gets_further_rates_up_to_the_bound_then_its_seeds():
    losses = {(1e-3, 0): 4.8, (3e-3, 0): 4.9, (1e-2, 0): 5.1}  # best at the lowest rate
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 3e-4, 0)]
    losses[(3e-4, 0)] = 4.7
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 1e-4, 0)]
    losses[(1e-4, 0)] = 4.6  # still at the edge, but two half-decades past the grid is the bound
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 1e-4, s) for s in REPORT]
    high = {(1e-3, 0): 5.3, (3e-3, 0): 5.0, (1e-2, 0): 4.9}
    assert next_jobs(PLAN, "other", RATES, high) == [Job("other", 3e-2, 0)]


def test_report_seeds_cannot_move_the_best_rate():
    losses = {(1e-3, 0): 5.0, (3e-3, 0): 4.9, (1e-2, 0): 5.1, **{(3e-3, s): 6.0 for s in REPORT}}
    assert best_rate(losses, [0]) == 3e-3  # chosen on the seed every rate has, not on the added ones
    assert next_jobs(PLAN, "other", RATES, losses) == []


def test_the_planned_count_is_every_grid_cell_plus_the_report_seeds():
    assert planned_runs(PLAN, ["base", "other"], RATES) == (3 * 3 + 2) + (3 * 1 + 2)


def test_a_finer_grid_steps_by_powers_of_ten_to_the_k_over_n():
    assert next_rate(1e-3, up=True, per_decade=5) == 10 ** (-14 / 5) == on_grid(1.58e-3, 5)
    assert next_rate(1e-2, up=False, per_decade=4) == on_grid(5.62e-3, 4) == 10**-2.25
    # a rate written to three digits and the rate stepped to from its neighbour are the same float
    assert next_rate(on_grid(2.51e-3, 5), up=True, per_decade=5) == on_grid(3.98e-3, 5)
    assert on_grid(3e-3, 2) == 3e-3  # the 1-3-10 grid keeps its rates
    ratios = [next_rate(lr, True, 5) / lr for lr in (10 ** (k / 5) for k in range(-20, -5))]
    assert max(ratios) < 10**0.25 and min(ratios) == pytest.approx(10**0.2)


def test_an_arm_of_its_own_grid_runs_it_and_steps_past_its_edge_on_that_grid():
    plan = StudyPlan(["a"], 1, 1, 1, rates_per_decade=5, rates={"a": [1e-2, 1.58e-2]})
    own, swept = [1e-2, 10 ** (-9 / 5)], [1e-3, 1e-2]
    assert next_jobs(plan, "a", swept, {}) == [Job("a", lr, 0) for lr in own]
    assert next_jobs(plan, "b", swept, {}) == [Job("b", lr, 0) for lr in swept]  # the sweep's rates
    best_at_top = {(own[0], 0): 5.0, (own[1], 0): 4.0}
    assert next_jobs(plan, "a", swept, best_at_top) == [Job("a", 10 ** (-8 / 5), 0)]
    assert planned_runs(plan, ["a", "b"], swept) == (2 + 1) + (2 + 1)
    with pytest.raises(ValueError, match="not on the grid of 5"):
        next_jobs(plan, "b", [3e-3], {})


def test_commands_train_exactly_the_jobs():
    jobs = {
        None: [Job("a", 1e-3, 0), Job("a", 3e-3, 0), Job("b", 1e-3, 0), Job("b", 3e-3, 0)]
        + [Job("a", 3e-3, s) for s in (1, 2)]
        + [Job("c", 1e-2, s) for s in (1, 2)]
    }
    swept = set()
    for command in commands(jobs):
        axes = dict(part.split("=", 1) for part in command)
        for arm, lr, seed in product(*(axes[k].split(",") for k in ("+variant", "train.lr", "seed"))):
            swept.add(Job(arm, float(lr), int(seed)))
    assert swept == set(jobs[None])
    # every rate travels as its shortest exact form, so a run records the very float the plan stepped to
    (command,) = commands({None: [Job("a", 10 ** (-14 / 5), 0)]})
    assert float(command[1].split("=")[1]) == 10 ** (-14 / 5)
    assert commands({"study_d32": [Job("a", 1e-3, 0)]}) == [
        ["model=study_d32", "+variant=a", "train.lr=0.001", "seed=0"]
    ]


def test_the_command_lines_sweep_axes_replace_the_experiments():
    axes, rest = split_axes(["+experiment=stability", "+variant=a,b", "train.lr=1e-3", "train.max_steps=3"])
    assert axes == {"+variant": "a,b", "train.lr": "1e-3"} and rest == ["+experiment=stability", "train.max_steps=3"]
