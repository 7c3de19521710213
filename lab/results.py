"""A study's runs as results: one per run of the grid, with the losses the statistics start from.

A diverged or unfinished run counts as the initial loss (Wortsman et al.'s capped loss); the grid
and the claims that python -m lab study planned are read from the study folder's plan file.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from lab.keys import metric_key
from lab.labels import as_arms
from lab.runs import Run, RunsError, check_comparable, load_runs

VAL_LOSS = metric_key("val/loss")
VAL_BPB = metric_key("val/bpb")
HELDOUT_LOSS = metric_key("heldout/loss")


@dataclass
class Result:
    """One run of the grid, reduced to what the report needs."""

    run: Run
    arm: str
    lr: float
    seed: int
    final: float | None  # the last logged value of the metric; None if the run never reached it
    diverged_at: int | None

    @property
    def initial_loss(self) -> float:
        return math.log(self.run.config["runtime"]["vocab_size"])


def load_results(inputs: list[str], metric: str) -> tuple[list[Result], list[str]]:
    """The grid's runs, and messages naming the run folders that were skipped. Where the study's plan names
    its runs (a study run one claim's arms at a time shares its folder with arms it has not asked for), runs
    of the other arms are left out, finished or not."""
    runs, skipped = load_runs(inputs)
    plan = read_plan(inputs)
    if plan and plan.get("runs"):
        asked = {tuple(pair) for pair in plan["runs"]}
        runs = [run for run in runs if (run.config.get("model", {}).get("name"), run.config["variant"]) in asked]
    results = []
    for run in runs:
        cfg = run.config
        if run.unfinished:
            skipped.append(f"{run.path}: {run.status()}; rerun the study to finish it")
            continue
        results.append(
            Result(run, cfg["variant"], float(cfg["train"]["lr"]), cfg["seed"], run.last(metric), run.diverged_at)
        )
    if not results:
        raise RunsError(f"no run under {', '.join(inputs)} has metrics to report on")
    check_comparable([r.run for r in results], metric)
    for r, arm in zip(results, as_arms([r.arm for r in results])):
        r.arm = arm
    return results, skipped


def capped_loss(result: Result) -> float:
    """Wortsman et al.'s min(final loss, initial loss): a diverged or unfinished run counts as the initial loss."""
    if result.diverged_at is not None or result.final is None:
        return result.initial_loss
    return min(result.final, result.initial_loss)


def heldout_loss(result: Result) -> float:
    """A run's held-out loss (capped at the initial loss), or its capped selection loss if it logged none."""
    value = result.run.last(HELDOUT_LOSS)
    if value is None or result.diverged_at is not None:
        return capped_loss(result)
    return min(value, result.initial_loss)


def by_model(results: list[Result]) -> dict[str, list[Result]]:
    """The results of each model (by its config name), in the order the models first appear."""
    grouped: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        grouped[r.run.config.get("model", {}).get("name", "")].append(r)
    return dict(grouped)


PLAN_FILE = "study_plan.json"  # what python -m lab study planned, written into the study's folder


def read_plan(inputs: list[str]) -> dict | None:
    """What python -m lab study recorded in a study folder (its grid, variants, runs and claims), if any."""
    for folder in inputs:
        plan = Path(folder) / PLAN_FILE
        if plan.is_file():
            return json.loads(plan.read_text())
    return None


def planned_grid(inputs: list[str]) -> list[float] | None:
    """The common learning-rate grid that python -m lab study recorded in a study folder, if any."""
    plan = read_plan(inputs)
    return sorted(plan["learning_rates"]) if plan else None


def common_grid(results: list[Result], planned: list[float] | None = None) -> list[float]:
    """The rates LR sensitivity is compared over: the planned grid where every variant ran it, else
    the rates every variant ran at (when every variant went past the same edge, those count too)."""
    by_arm: dict[str, set] = defaultdict(set)
    for r in results:
        by_arm[r.arm].add(r.lr)
    shared = set.intersection(*by_arm.values())
    return sorted(shared & set(planned)) if planned and set(planned) <= shared else sorted(shared)
