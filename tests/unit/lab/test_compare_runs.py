"""lab/compare_runs.py's comparison with the baseline, on runs made in memory with known final losses."""

from pathlib import Path

import pytest

from lab.compare_runs import against_baseline, reading
from lab.runs import Run
from lab.stats import paired_comparison, unpaired_comparison


def runs(finals: dict[int, float], name: str = "arm") -> list[Run]:
    """One run per seed, whose last val/loss is ``finals[seed]``."""
    return [
        Run(Path(f"{name}-s{seed}"), {"seed": seed, "variant": name}, [{"step": 1, "val/loss": loss}], "t")
        for seed, loss in finals.items()
    ]


def test_three_paired_seeds_are_compared_and_read():
    arm, base = {0: 4.90, 1: 5.00, 2: 5.11}, {0: 5.00, 1: 5.11, 2: 5.20}
    compared = against_baseline(runs(arm), runs(base, "base"), "val/loss")
    assert compared.test == "paired t, seeds 0, 1, 2"
    by_hand = paired_comparison([-0.10, -0.11, -0.09], "lower")
    assert compared.result.ci95 == pytest.approx(by_hand.ci95) and compared.result.p == pytest.approx(by_hand.p)
    assert reading(compared.result) == "lower"  # -0.1 with a spread of 0.01 a seed
    assert reading(against_baseline(runs(base), runs(arm, "base"), "val/loss").result) == "higher"


def test_seeds_on_one_side_only_are_left_out_and_named():
    arm, base = {0: 4.9, 1: 5.0, 2: 5.1, 3: 7.0}, {0: 5.0, 1: 5.1, 2: 5.2, 5: 1.0}
    compared = against_baseline(runs(arm), runs(base, "base"), "val/loss")
    assert compared.test == "paired t, seeds 0, 1, 2 (seeds 3, 5 ran on one side only: left out)"
    assert compared.result.difference == pytest.approx(-0.1)
    # what the test read, kept so it can be recomputed: the paired seeds and each side's value on them
    assert compared.values == {"seeds": [0, 1, 2], "group": [4.9, 5.0, 5.1], "baseline": [5.0, 5.1, 5.2]}


def test_runs_that_do_not_pair_fall_back_to_welch_named_as_such():
    base = runs({0: 5.0, 1: 5.1, 2: 5.2}, "base")
    apart = runs({3: 4.0, 4: 4.1, 5: 4.2})  # other seeds
    compared = against_baseline(apart, base, "val/loss")
    assert compared.test == "Welch's t, unpaired: fewer than two seeds pair"
    by_hand = unpaired_comparison([4.0, 4.1, 4.2], [5.0, 5.1, 5.2])
    assert compared.result.ci95 == pytest.approx(by_hand.ci95) and compared.result.p == pytest.approx(by_hand.p)
    assert compared.values == {"group": [4.0, 4.1, 4.2], "baseline": [5.0, 5.1, 5.2]}
    twice = runs({0: 4.0, 1: 4.1}) + runs({0: 4.2})  # seed 0 twice in the group: no pairing is possible
    assert against_baseline(twice, base, "val/loss").test.startswith("Welch's t, unpaired")


def test_one_run_a_side_is_no_test_and_two_seeds_are_not_read():
    compared = against_baseline(runs({0: 4.0}), runs({0: 5.0, 1: 5.1}, "base"), "val/loss")
    assert (compared.test, compared.result, reading(compared.result)) == ("no test: one run on a side", None, "–")
    two = against_baseline(runs({0: 4.0, 1: 4.1}), runs({0: 5.0, 1: 5.1}, "base"), "val/loss")
    assert two.result.ci95 == (pytest.approx(-1.0), pytest.approx(-1.0)) and two.result.verdict == "agrees"
    assert reading(two.result) == "not read: 2 seeds"
