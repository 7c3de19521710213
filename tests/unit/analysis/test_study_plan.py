"""What a study trains stage by stage (analysis/study_plan.py), and the one command that runs it to the end."""

from itertools import product

import pytest
from run_study import commands, split_axes

from analysis.study_plan import Job, StudyPlan, best_rate, half_decade, next_jobs

RATES = [1e-3, 3e-3, 1e-2]
PLAN = StudyPlan(headline=["base"], headline_seeds=3, best_rate_seeds=5, extra_rates=2)


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


def test_an_interior_best_rate_gets_its_seeds():
    losses = {(1e-3, 0): 5.2, (3e-3, 0): 4.9, (1e-2, 0): 5.1}
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 3e-3, s) for s in range(1, 5)]
    losses.update({(3e-3, s): 4.9 for s in range(1, 5)})
    assert next_jobs(PLAN, "other", RATES, losses) == []


def test_a_best_rate_at_an_edge_gets_further_rates_up_to_the_bound_then_its_seeds():
    losses = {(1e-3, 0): 4.8, (3e-3, 0): 4.9, (1e-2, 0): 5.1}  # best at the lowest rate
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 3e-4, 0)]
    losses[(3e-4, 0)] = 4.7
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 1e-4, 0)]
    losses[(1e-4, 0)] = 4.6  # still at the edge, but two half-decades past the grid is the bound
    assert next_jobs(PLAN, "other", RATES, losses) == [Job("other", 1e-4, s) for s in range(1, 5)]
    high = {(1e-3, 0): 5.3, (3e-3, 0): 5.0, (1e-2, 0): 4.9}
    assert next_jobs(PLAN, "other", RATES, high) == [Job("other", 3e-2, 0)]


def test_seeds_added_at_the_best_rate_cannot_move_it():
    losses = {(1e-3, 0): 5.0, (3e-3, 0): 4.9, (1e-2, 0): 5.1, **{(3e-3, s): 6.0 for s in range(1, 5)}}
    assert best_rate(losses, [0]) == 3e-3  # chosen on the seed every rate has, not on the added ones


def test_commands_train_exactly_the_jobs():
    jobs = {
        None: [Job("a", 1e-3, 0), Job("a", 3e-3, 0), Job("b", 1e-3, 0), Job("b", 3e-3, 0)]
        + [Job("a", 3e-3, s) for s in (1, 2)]
        + [Job("c", 1e-2, s) for s in (1, 2)]
    }
    swept = set()
    for command in commands(jobs):
        axes = dict(part.split("=", 1) for part in command)
        for variant, lr, seed in product(*(axes[k].split(",") for k in ("+variant", "train.lr", "seed"))):
            swept.add(Job(variant, float(lr), int(seed)))
    assert swept == set(jobs[None])
    assert commands({"study_d32": [Job("a", 1e-3, 0)]}) == [
        ["model=study_d32", "+variant=a", "train.lr=0.001", "seed=0"]
    ]


def test_the_command_lines_sweep_axes_replace_the_experiments():
    axes, rest = split_axes(["+experiment=stability", "+variant=a,b", "train.lr=1e-3", "train.max_steps=3"])
    assert axes == {"+variant": "a,b", "train.lr": "1e-3"} and rest == ["+experiment=stability", "train.max_steps=3"]
