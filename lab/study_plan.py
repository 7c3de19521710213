"""What a learning-rate study trains, stage by stage, decided from the runs it already has.

A study's grid is its Hydra sweep (``+variant`` variants x ``train.lr`` rates); ``plan:`` in the
study's spec says what comes after it (configs/study/stability.yaml):

1. the grid: every variant at every rate with its selection seeds (``headline_seeds`` for the
   variants a claim compares, ``selection_seeds`` for the others), the same seeds for all;
2. the edges: a variant whose best rate is the lowest (highest) rate it ran at gets the next
   rate below (above) with its selection seeds, at most ``extra_rates`` per side;
3. the report seeds: ``report_seeds`` further seeds, the same for every variant, at each variant's
   best rate. They report its loss there and never chose the rate.

The best rate is chosen on the selection seeds alone, so the report seeds cannot move it and the
loss they report is free of the luck that chose it. Each stage is a pure function of the finished
runs, so rerunning the study recomputes where it stands and trains only what is missing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional  # noqa: UP035  # OmegaConf reads these annotations (the config schema)

# ruff: noqa: UP006, UP045

# A study of several models is reported along one of their sizes (lab/across_models.py): name -> its unit.
AXES = {
    "n_layers": "layers",
    "d_model": "d_model",
    "params": "parameters",
    "non_embedding_params": "non-embedding parameters",
}


@dataclass
class StudyPlan:
    """The schema of ``plan:`` in a study's spec (lab/study_spec.py)."""

    headline: List[str] = field(default_factory=list)  # the +variant options a claim compares
    headline_seeds: int = 5  # selection seeds of the headline variants, at every rate
    selection_seeds: int = 3  # selection seeds of every other variant, at every rate
    report_seeds: int = 5  # further seeds at each variant's best rate, which report its loss there
    first_seed: int = 0  # the selection seeds start here: a new edition runs fresh seeds, unseen by its claims
    extra_rates: int = 2  # rates past an edge of the grid, per variant and side, at most
    # How finely the rates step: 2 is the 1-3-10 grid (3e-3 -> 1e-2); any other n puts every rate on
    # 10^(k/n), so 5 steps 1e-3 -> 10^-2.8 (1.58e-3) -> 10^-2.6 (2.51e-3) -> ... -> 1e-2.
    rates_per_decade: int = 2
    # A variant's own grid (variant -> rates) in place of the sweep's train.lr, where the arms' best
    # rates lie too far apart for one grid to hold them all at a fine step.
    rates: Dict[str, List[float]] = field(default_factory=dict)
    seconds_per_run: float = 60.0  # one run's time, for the estimate before any run has finished
    # eval.py layer_importance=true on each report seed's final checkpoint (skip deltas per block), after training
    layer_importance: bool = False
    # A study of several models (its sweep's ``model``): the size they are reported along, one of AXES; None:
    # one model, the one-model report
    axis: Optional[str] = None

    def __post_init__(self) -> None:
        if self.axis is not None and self.axis not in AXES:
            raise ValueError(f"plan.axis must be one of {', '.join(AXES)}, got {self.axis!r}")


@dataclass(frozen=True)
class Job:
    arm: str  # the +variant option
    lr: float
    seed: int


def half_decade(lr: float, up: bool) -> float:
    """The next rate on the 1-3-10 grid: 3e-4 -> 1e-3 (up), 3e-4 -> 1e-4 (down)."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    mantissa = lr / 10**exponent
    if math.isclose(mantissa, 1.0, rel_tol=1e-6):
        return float(f"{3 * 10 ** (exponent - (0 if up else 1)):.0e}")
    if math.isclose(mantissa, 3.0, rel_tol=1e-6):
        return float(f"{10 ** (exponent + (1 if up else 0)):.0e}")
    raise ValueError(f"learning rate {lr:g} is not 1 or 3 times a power of ten; a study's grid steps by half-decades")


def on_grid(lr: float, per_decade: int) -> float:
    """``lr`` on the grid of ``per_decade`` rates a decade: itself on the 1-3-10 grid, else the nearest
    10^(k/n), so that a rate written to a few digits (1.58e-3) and a rate stepped to are one float."""
    if per_decade == 2:
        return lr
    k = round(math.log10(lr) * per_decade)
    if abs(math.log10(lr) * per_decade - k) > 0.05:
        raise ValueError(
            f"learning rate {lr:g} is not on the grid of {per_decade} rates a decade (10^(k/{per_decade}))"
        )
    return 10 ** (k / per_decade)


def next_rate(lr: float, up: bool, per_decade: int) -> float:
    """The grid's next rate above (``up``) or below ``lr``."""
    if per_decade == 2:
        return half_decade(lr, up)
    return 10 ** ((round(math.log10(lr) * per_decade) + (1 if up else -1)) / per_decade)


def arm_grid(plan: StudyPlan, arm: str, sweep_rates: list[float]) -> list[float]:
    """The rates ``variant`` runs with its selection seeds before any edge: its own (``plan.rates``) or the sweep's."""
    return sorted(on_grid(lr, plan.rates_per_decade) for lr in plan.rates.get(arm, sweep_rates))


def grid_seeds(plan: StudyPlan, arm: str) -> list[int]:
    """The seeds that choose ``variant``'s best rate: they run at every rate it runs at."""
    count = plan.headline_seeds if arm in plan.headline else plan.selection_seeds
    return list(range(plan.first_seed, plan.first_seed + count))


def report_seeds(plan: StudyPlan) -> list[int]:
    """The seeds that report every variant's loss at its best rate: after every variant's selection seeds."""
    first = plan.first_seed + max(plan.headline_seeds if plan.headline else 0, plan.selection_seeds)
    return list(range(first, first + plan.report_seeds))


def best_rate(losses: dict[tuple[float, int], float], seeds: list[int]) -> float | None:
    """The rate with the lowest mean loss over ``seeds`` among rates that have all of them; of equal
    losses (every rate capped at the initial loss), the lowest rate. The study's report uses it too."""
    rates = sorted({lr for lr, _ in losses})
    complete = {
        lr: statistics.fmean(losses[(lr, s)] for s in seeds) for lr in rates if all((lr, s) in losses for s in seeds)
    }
    return min(complete, key=lambda lr: (complete[lr], lr)) if complete else None


def next_jobs(plan: StudyPlan, arm: str, rates: list[float], losses: dict[tuple[float, int], float]) -> list[Job]:
    """What ``variant`` trains next, given ``losses[(lr, seed)]`` of its finished runs (capped: a
    diverged run counts as the initial loss) and the sweep's rates. Empty when its part of the study is complete."""
    rates = arm_grid(plan, arm, rates)
    seeds = grid_seeds(plan, arm)
    missing = [Job(arm, lr, s) for lr in rates for s in seeds if (lr, s) not in losses]
    if missing:
        return missing
    tried = sorted({lr for lr, _ in losses})
    best = best_rate(losses, seeds)
    for edge, up in ((tried[0], False), (tried[-1], True)):
        beyond = [lr for lr in tried if (lr > max(rates) if up else lr < min(rates))]
        if best == edge and len(beyond) < plan.extra_rates:
            lr = next_rate(edge, up, plan.rates_per_decade)
            return [Job(arm, lr, s) for s in seeds]
    return [Job(arm, best, s) for s in report_seeds(plan) if (best, s) not in losses]


def planned_runs(plan: StudyPlan, arms: list[str], rates: list[float]) -> int:
    """How many runs the study trains when no variant needs edge rates (each edge adds its selection seeds)."""
    return sum(len(arm_grid(plan, v, rates)) * len(grid_seeds(plan, v)) + plan.report_seeds for v in arms)
