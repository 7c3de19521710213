"""A learning-rate study's report: which norm variants train well over which rates, and what its claims show.

The library behind ``scripts/study_report.py``:

    python train.py -m +experiment=stability
    python scripts/study_report.py runs/stability --out study/ --speed bench_out/variants/results.json

In the style of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") and Peri-LN (Kim et al. 2025). Reads every run under the inputs (runs missing
metrics are named and skipped) and writes into --out:

- loss_vs_lr.png: final validation loss and bits per byte against learning rate, one curve per
  variant, diverged runs marked at the initial loss;
- report.md: per variant the best learning rate and loss (mean ± std over seeds, Welch's p
  against the baseline from two seeds up), the LR sensitivity, divergences, the speed table when
  --speed names a scripts/bench_variants.py result, and the claims the experiment config
  declares (analysis/claims.py), each with its statistic, interval and verdict;
- attention_logits.png: the largest attention logit against step, at the highest learning rate
  the baseline survives and the next one up;
- depth.png: the residual stream's RMS, the massive-activation ratio and the attention-sink mass
  against depth at the end of training;
- feature_kurtosis.png: the outlier-feature kurtosis of the residual stream over training.

LR sensitivity (Wortsman et al., Sec. 3.1): the mean over the learning-rate grid of
``min(final loss, initial loss) - best loss``, where a diverged run counts as the initial loss
and the initial loss is that of the untrained model, ln(vocabulary size).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.claims import Claim, matches, verdict
from analysis.keys import fields, metric_key
from analysis.plots import pyplot, save
from analysis.runs import BASELINE, Run, RunsError, check_comparable, layer_values, load_runs
from analysis.stats import bootstrap_ci, paired_p_value
from analysis.study_plan import best_rate
from training.run_record import flatten

VAL_LOSS = metric_key("val/loss")
VAL_BPB = metric_key("val/bpb")
STREAM_RMS = metric_key("act/layers.{i}/stream_rms")
STREAM_KURTOSIS = metric_key("act/layers.{i}/stream_feature_kurtosis")
MAX_LOGIT = metric_key("attn/layers.{i}/max_logit")
HELDOUT_LOSS = metric_key("heldout/loss")
GRAD_BY_LAYER = metric_key("grad/{part}").replace("{part}", "layers.{i}")
SATURATED = metric_key("act/{norm}/saturated")
BY_DEPTH = (
    (STREAM_RMS, "residual stream RMS leaving the block"),
    (metric_key("act/layers.{i}/massive_ratio"), "massive-activation ratio (max |h| / median |h|)"),
    (metric_key("attn/layers.{i}/sink_mass"), "attention-sink mass (weight on position 0)"),
)


@dataclass
class Result:
    """One run of the grid, reduced to what the report needs."""

    run: Run
    variant: str
    lr: float
    seed: int
    final: float | None  # the last logged value of the metric; None if the run never reached it
    diverged_at: int | None

    @property
    def initial_loss(self) -> float:
        return math.log(self.run.config["runtime"]["vocab_size"])


def load_results(inputs: list[str], metric: str) -> tuple[list[Result], list[str]]:
    """The grid's runs, and messages naming the run folders that were skipped."""
    runs, skipped = load_runs(inputs)
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
    shared = shared_switches([r.variant for r in results])
    for r in results:
        r.variant = without_switches(r.variant, shared)
    return results, skipped


def shared_switches(labels: list[str]) -> list[str]:
    """The switches every variant's label has (``wd_independent`` when the whole study decays
    independently), so that variants can be named by what tells them apart."""
    parts = [label.split("-") for label in set(labels)]
    if len(parts) < 2:
        return []
    return [part for part in parts[0][1:] if all(part in p[1:] for p in parts)]


def without_switches(label: str, switches: list[str]) -> str:
    """``label`` less ``switches`` (its first part, the norm's name, always stays): ``rmsnorm-qk``."""
    parts = label.split("-")
    return "-".join([parts[0], *(p for p in parts[1:] if p not in switches)])


def capped_loss(result: Result) -> float:
    """Wortsman et al.'s min(final loss, initial loss): a diverged or unfinished run counts as the initial loss."""
    if result.diverged_at is not None or result.final is None:
        return result.initial_loss
    return min(result.final, result.initial_loss)


def lr_sensitivity(losses_by_lr: dict[float, float]) -> float:
    """Mean over the grid of (capped loss - best capped loss); 0 means equally good at every rate."""
    best = min(losses_by_lr.values())
    return statistics.fmean(loss - best for loss in losses_by_lr.values())


@dataclass
class VariantSummary:
    variant: str
    losses_by_lr: dict[float, float]  # mean capped loss over seeds, at every rate the variant ran
    grid_seeds: list[int]  # the seeds it ran at every one of its rates: the best rate is chosen on them
    best_lr: float
    best_values: list[float]  # per seed, at the best learning rate
    sensitivity: float  # over the common grid, on the grid seeds
    diverged: list[float]  # learning rates at which some seed diverged

    @property
    def rates(self) -> list[float]:
        return sorted(self.losses_by_lr)

    @property
    def best_mean(self) -> float:
        return statistics.fmean(self.best_values)

    @property
    def best_std(self) -> float:
        return statistics.pstdev(self.best_values)


PLAN_FILE = "study_plan.json"  # what scripts/run_study.py planned, written into the study's folder


def read_plan(inputs: list[str]) -> dict | None:
    """What scripts/run_study.py recorded in a study folder (its grid, variants and claims), if any."""
    for folder in inputs:
        plan = Path(folder) / PLAN_FILE
        if plan.is_file():
            return json.loads(plan.read_text())
    return None


def planned_grid(inputs: list[str]) -> list[float] | None:
    """The common learning-rate grid that scripts/run_study.py recorded in a study folder, if any."""
    plan = read_plan(inputs)
    return sorted(plan["learning_rates"]) if plan else None


def common_grid(results: list[Result], planned: list[float] | None = None) -> list[float]:
    """The rates LR sensitivity is compared over: the planned grid where every variant ran it, else
    the rates every variant ran at (when every variant went past the same edge, those count too)."""
    by_variant: dict[str, set] = defaultdict(set)
    for r in results:
        by_variant[r.variant].add(r.lr)
    shared = set.intersection(*by_variant.values())
    return sorted(shared & set(planned)) if planned and set(planned) <= shared else sorted(shared)


def mean_capped(runs: list[Result], seeds: list[int] | None = None) -> float:
    """The mean capped loss of ``runs`` (of those seeds only, when given)."""
    return statistics.fmean(capped_loss(r) for r in runs if seeds is None or r.seed in seeds)


def summarize(results: list[Result], grid: list[float]) -> dict[str, VariantSummary]:
    by_variant: dict[str, dict[float, list[Result]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_variant[r.variant][r.lr].append(r)
    summaries = {}
    for variant, by_lr in sorted(by_variant.items()):
        seeds = sorted(set.intersection(*({r.seed for r in runs} for runs in by_lr.values())))

        losses = {lr: mean_capped(by_lr[lr]) for lr in sorted(by_lr)}
        if seeds:
            best_lr = best_rate({(r.lr, r.seed): capped_loss(r) for runs in by_lr.values() for r in runs}, seeds)
            sensitivity = lr_sensitivity({lr: mean_capped(by_lr[lr], seeds) for lr in grid})
        else:  # no seed ran at every rate: choose on the means over all runs
            best_lr = min(losses, key=lambda lr: (losses[lr], lr))
            sensitivity = lr_sensitivity({lr: losses[lr] for lr in grid})
        summaries[variant] = VariantSummary(
            variant,
            losses,
            seeds,
            best_lr,
            [capped_loss(r) for r in sorted(by_lr[best_lr], key=lambda r: r.seed)],
            sensitivity,
            sorted(lr for lr, runs in by_lr.items() if any(r.diverged_at is not None for r in runs)),
        )
    return summaries


def plot_loss_vs_lr(results: list[Result], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], VAL_LOSS, "final validation loss (nats/token)"), (axes[1], VAL_BPB, "bpb")):
        for i, variant in enumerate(sorted({r.variant for r in results})):
            runs = [r for r in results if r.variant == variant]
            lrs = sorted({r.lr for r in runs})
            style = {"color": plt.get_cmap("tab20")(i % 20), "linestyle": ("-", "--", ":")[i // 20 % 3]}
            means = []
            for lr in lrs:
                values = [r.run.last(key) for r in runs if r.lr == lr and r.diverged_at is None]
                means.append(statistics.fmean(values) if values and None not in values else float("nan"))
            (line,) = ax.plot(lrs, means, marker="o", label=variant, **style)  # 20 colours before a style repeats
            if key == VAL_LOSS:
                diverged = sorted({r.lr for r in runs if r.diverged_at is not None})
                ax.scatter(diverged, [runs[0].initial_loss] * len(diverged), marker="x", s=80, color=line.get_color())
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title("x: diverged (plotted at the initial loss)")
    axes[0].legend(fontsize=8, loc="center left")  # clear of the diverged marks along the top
    save(fig, path)


def _over_layers(run: Run, template: str, reduce=max) -> list[tuple[int, float]]:
    """(step, ``reduce`` over layers of ``template``) for every row that logged layer 0."""
    return [(row["step"], reduce(values)) for row in run.rows if (values := layer_values(row, template))]


def surviving_lrs(results: list[Result], baseline: str) -> tuple[float | None, float | None]:
    """The highest learning rate at which the baseline did not diverge, and the next one up (or None)."""
    lrs = sorted({r.lr for r in results if r.variant == baseline})  # not the rates only others ran past an edge
    survived = [lr for lr in lrs if all(r.diverged_at is None for r in results if r.variant == baseline and r.lr == lr)]
    highest = max(survived) if survived else None
    above = [lr for lr in lrs if highest is not None and lr > highest]
    return highest, (above[0] if above else None)


def _log_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_attention_logits(results: list[Result], lrs: list[float], path: Path) -> None:
    """Max attention logit (over layers) against step, one panel per learning rate."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(lrs), figsize=(6 * len(lrs), 4.5), squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        for r in sorted(
            (r for r in results if r.lr == lr and r.seed == min(x.seed for x in results)), key=lambda r: r.variant
        ):
            points = _over_layers(r.run, MAX_LOGIT)
            if points:
                ax.plot(*zip(*points), label=r.variant + (" (diverged)" if r.diverged_at else ""))
        _log_axes(ax, "step", "attention logit", f"lr {lr:g}: largest pre-softmax attention logit (max over layers)")
    save(fig, path)


def plot_depth_and_kurtosis(results: list[Result], lr: float, depth_path: Path, kurtosis_path: Path) -> None:
    """The Peri-LN figure (stream RMS against depth) beside the massive-activation ratio and the
    attention-sink mass against depth, and feature kurtosis over training, at one learning rate."""
    plt = pyplot()
    chosen = sorted(
        (r for r in results if r.lr == lr and r.seed == min(x.seed for x in results)), key=lambda r: r.variant
    )
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for ax, (template, label) in zip(axes, BY_DEPTH):
        for r in chosen:
            values = r.run.by_layer(template)  # at the last step that logged it
            if values:
                ax.plot(range(1, len(values) + 1), values, marker="o", label=r.variant)
        _log_axes(ax, "block (depth)", label, f"end of training, lr {lr:g}")
    save(fig, depth_path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in chosen:
        points = _over_layers(r.run, STREAM_KURTOSIS, statistics.fmean)
        if points:
            ax.plot(*zip(*points), label=r.variant)
    ylabel = "feature kurtosis of the residual stream (mean over blocks)"
    _log_axes(ax, "step", ylabel, f"outlier features (3 = none), lr {lr:g}")
    save(fig, kurtosis_path)


def speed_table(path: Path | None, variants: list[str]) -> str:
    if path is None:
        return (
            "No speed measurement was given (--speed). Measure the variants by interleaving them in one "
            "process with `python scripts/bench_variants.py` and pass its results.json."
        )
    data = json.loads(Path(path).read_text())
    meta = data["meta"]
    lines = [
        f"From `scripts/bench_variants.py` ({meta['rounds']} interleaved rounds of {meta['steps']} steps, model "
        f"{meta['model']}, {meta['device']}):",
        "",
        f"| variant | tokens/s (median) | vs {meta['baseline']} (median) | min – max |",
        "|---|---|---|---|",
    ]
    for row in data["rows"]:
        if row["variant"] in variants:
            lines.append(
                f"| {row['variant']} | {row['tokens_per_sec']:,.0f} | {row['ratio']:.3f} | "
                f"{row['ratio_min']:.3f} – {row['ratio_max']:.3f} |"
            )
    return "\n".join(lines)


# A variant trained when its best loss is at least this far (nats) below the unigram loss of the
# validation windows (runtime.unigram_val_loss); runs recorded before that line existed fall back
# to UNTRAINED_GAP above the baseline's best. Either way, a variant that did not train has a low
# LR sensitivity only because every rate is equally poor.
TRAINED_MARGIN = 0.3
UNTRAINED_GAP = 0.5


class Study:
    """The grid's results, per variant, with statistics that can be taken over any multiset of seeds
    (so a bootstrap over seeds resamples whole seeds, keeping runs of one seed paired)."""

    def __init__(self, results: list[Result], baseline: str, planned_grid: list[float] | None = None) -> None:
        self.results = results
        self.grid = common_grid(results, planned_grid)
        self.summaries = summarize(results, self.grid)
        if baseline not in self.summaries:
            raise RunsError(f"the baseline {baseline!r} is not among the variants: {', '.join(self.summaries)}")
        self.baseline = baseline
        self.cells: dict[tuple[str, float, int], Result] = {(r.variant, r.lr, r.seed): r for r in results}
        self.seeds = sorted({r.seed for r in results})
        self.lrs = sorted({r.lr for r in results})
        base = self.summaries[baseline]
        self.unigram_loss = next((r.run.config["runtime"].get("unigram_val_loss") for r in results), None)
        if self.unigram_loss is not None:
            line = self.unigram_loss - TRAINED_MARGIN
            self.untrained = {v for v, s in self.summaries.items() if s.best_mean > line}
        else:
            self.untrained = {v for v, s in self.summaries.items() if s.best_mean - base.best_mean > UNTRAINED_GAP}
        self.survived_lr, self.lr_above = surviving_lrs(results, baseline)

    def best_inside(self, variant: str) -> bool:
        """Whether the variant's best rate lies strictly inside the rates it ran at."""
        rates = self.summaries[variant].rates
        return rates[0] < self.summaries[variant].best_lr < rates[-1]

    def config(self, variant: str) -> dict:
        return next(r.run for r in self.results if r.variant == variant).config

    def variant_with(self, fields: dict) -> str | None:
        """The one variant whose runs have every config value in ``fields`` (None if none; refused if several)."""
        found = [v for v in self.summaries if matches(flatten(self.config(v)).__getitem__, fields)]
        if len(found) > 1:
            raise RunsError(f"the claim's arm {fields} matches several variants ({', '.join(found)}): name more fields")
        return found[0] if found else None

    def _runs(self, variant: str, lr: float, seeds) -> list[Result]:
        return [self.cells[(variant, lr, s)] for s in seeds if (variant, lr, s) in self.cells]

    def lr_sensitivity(self, variant: str, seeds) -> float | None:
        """Over the common grid, from the given seeds' runs; None unless every grid rate has all of them
        (a seed run only at the best rate says nothing about sensitivity)."""
        wanted = set(seeds)
        if not all(wanted <= {r.seed for r in self._runs(variant, lr, self.seeds)} for lr in self.grid):
            return None
        losses = {lr: statistics.fmean(capped_loss(r) for r in self._runs(variant, lr, seeds)) for lr in self.grid}
        return lr_sensitivity(losses) if losses else None

    def best_loss(self, variant: str, seeds) -> float | None:
        """The loss at the variant's best rate, on the held-out windows where the runs logged them."""
        values = [heldout_loss(r) for r in self._runs(variant, self.summaries[variant].best_lr, seeds)]
        return statistics.fmean(values) if values else None

    def stream_growth(self, variant: str, seeds) -> float | None:
        """Last-block over first-block stream RMS at the end of training, at the baseline's best rate."""
        ratios = [
            rms[-1] / rms[0]
            for r in self._runs(variant, self.summaries[self.baseline].best_lr, seeds)
            if (rms := r.run.by_layer(STREAM_RMS))
        ]
        return statistics.fmean(ratios) if ratios else None

    def max_attn_logit(self, variant: str, seeds) -> float | None:
        """The largest attention logit (over layers) at the last stats step, at the highest rate the baseline survives."""
        if self.survived_lr is None:
            return None
        values = [
            points[-1][1]
            for r in self._runs(variant, self.survived_lr, seeds)
            if (points := _over_layers(r.run, MAX_LOGIT))
        ]
        return statistics.fmean(values) if values else None


# name -> Study method; a claim's `statistic` is one of these.
STATISTICS: dict[str, Callable] = {
    "lr_sensitivity": Study.lr_sensitivity,
    "best_loss": Study.best_loss,
    "stream_growth": Study.stream_growth,
    "max_attn_logit": Study.max_attn_logit,
}


def seed_interval(study: Study, statistic: Callable, variant: str) -> tuple[float, float] | None:
    """95% bootstrap interval of ``statistic`` (a Study method) over the variant's seeds, resampled whole."""
    seeds = [s for s in study.seeds if statistic(study, variant, [s]) is not None]
    if len(seeds) < 2:
        return None
    return bootstrap_ci(seeds, lambda sample: statistic(study, variant, [int(s) for s in sample]), resamples=2000)


def heldout_loss(result: Result) -> float:
    """A run's held-out loss (capped at the initial loss), or its capped selection loss if it logged none."""
    value = result.run.last(HELDOUT_LOSS)
    if value is None or result.diverged_at is not None:
        return capped_loss(result)
    return min(value, result.initial_loss)


def heldout_best_loss(study: Study, variant: str) -> tuple[list[float], str]:
    """The variant's per-seed loss at its best rate (chosen on the selection windows), on the held-out
    windows when the runs logged them, else on the selection windows; and which key that is."""
    runs = study._runs(variant, study.summaries[variant].best_lr, study.seeds)
    heldout = [r.run.last(HELDOUT_LOSS) for r in runs]
    if runs and all(v is not None for v in heldout) and all(r.diverged_at is None for r in runs):
        return heldout, HELDOUT_LOSS
    return [capped_loss(r) for r in runs], "selection windows (no held-out windows logged)"


def explanation(study: Study, variant: str) -> str:
    """Why a variant did not train, from its own probes at its best rate: gradient norms by layer,
    the residual stream's growth, DyT/Derf saturation (what the run logged last)."""
    if variant not in study.untrained:
        return ""
    summary = study.summaries[variant]
    run = study._runs(variant, summary.best_lr, study.seeds)[0].run
    rule = (
        f"not {TRAINED_MARGIN} nats below the unigram loss {study.unigram_loss:.3f}"
        if study.unigram_loss is not None
        else f"more than {UNTRAINED_GAP} nats above the baseline's best"
    )
    parts = [f"best loss {summary.best_mean:.3f} at lr {summary.best_lr:g}, {rule}"]
    grads = run.by_layer(GRAD_BY_LAYER)
    if grads:
        parts.append("gradient norm by layer " + ", ".join(f"{g:.2g}" for g in grads))
    rms = run.by_layer(STREAM_RMS)
    if rms:
        parts.append(f"stream RMS {rms[0]:.3g} after block 1, {rms[-1]:.3g} after the last")
    row = run.rows[-1]
    saturated = [v for k, v in row.items() if fields(SATURATED, k) is not None]
    if saturated:
        parts.append(f"mean saturation of its DyT/Derf norms {statistics.fmean(saturated):.0%}")
    return "; ".join(parts)


def study_json(study: Study, metric: str, evaluated: list[dict]) -> dict:
    """The study's machine-readable results (study.json)."""
    variants = {}
    for name, summary in study.summaries.items():
        best, best_key = heldout_best_loss(study, name)
        variants[name] = {
            "best_lr": summary.best_lr,
            "rates": summary.rates,
            "best_lr_inside": study.best_inside(name),
            "grid_seeds": summary.grid_seeds,
            "best_loss": {
                "mean": statistics.fmean(best) if best else None,
                "ci95": bootstrap_ci(best) if len(best) > 1 else None,
                "seeds": len(best),
                "measured_on": best_key,
            },
            "lr_sensitivity": {
                "value": summary.sensitivity,
                "ci95": seed_interval(study, Study.lr_sensitivity, name),
            },
            "trained": name not in study.untrained,
            "explanation": explanation(study, name),
        }
    return {
        "metric": metric,
        "initial_loss": study.results[0].initial_loss,
        "unigram_loss": study.unigram_loss,
        "learning_rates": study.grid,
        "cells": [
            {"variant": r.variant, "lr": r.lr, "seed": r.seed, "loss": r.final, "diverged": r.diverged_at is not None}
            for r in sorted(study.results, key=lambda r: (r.variant, r.lr, r.seed))
        ],
        "variants": variants,
        "claims": [{**c, "ci95": list(c["ci95"]) if c.get("ci95") else None} for c in evaluated],
    }


def evaluate_claim(claim: Claim, study: Study) -> dict:
    """The claim with both arms' statistic, their paired difference (95% bootstrap interval over
    seeds, paired t-test p-value) and the verdict that the interval supports. A claim that says why
    it is not tested (``not_tested:``) keeps its numbers where they exist, and that verdict."""
    if claim.statistic not in STATISTICS:
        raise RunsError(f"claim {claim.claim!r}: unknown statistic {claim.statistic!r}; one of {', '.join(STATISTICS)}")
    result = {"claim": claim.claim, "source": claim.source, "statistic": claim.statistic, "expect": claim.expect}
    arm, against = study.variant_with(claim.arm), study.variant_with(claim.against)
    result.update(arm=arm, against=against)

    def not_tested(why: str) -> dict:
        return {**result, "verdict": "not tested", "why": claim.not_tested or why}

    missing = [str(fields) for fields, v in ((claim.arm, arm), (claim.against, against)) if v is None]
    if missing:
        return not_tested(f"no variant in these runs has {' or '.join(missing)}")
    untrained = sorted({arm, against} & study.untrained)
    if untrained:
        return not_tested(f"{', '.join(untrained)} did not train at any rate here, so the study cannot show this")
    at_edge = sorted(v for v in (arm, against) if not study.best_inside(v))
    if at_edge:
        return not_tested(f"{', '.join(at_edge)}: best rate at an edge of the rates run, so its best is not known")
    stat = STATISTICS[claim.statistic]
    seeds = [s for s in study.seeds if stat(study, arm, [s]) is not None and stat(study, against, [s]) is not None]
    if not seeds:
        return not_tested(f"no seed has {claim.statistic} for both arms")
    a, b = stat(study, arm, seeds), stat(study, against, seeds)

    def difference(sample) -> float:
        seeds_drawn = [int(s) for s in sample]
        return stat(study, arm, seeds_drawn) - stat(study, against, seeds_drawn)

    ci = bootstrap_ci(seeds, difference, resamples=2000) if len(seeds) > 1 else None
    p = paired_p_value([stat(study, arm, [s]) for s in seeds], [stat(study, against, [s]) for s in seeds])
    result.update(value_arm=a, value_against=b, difference=a - b, ci95=ci, p=p, seeds=len(seeds))
    if claim.not_tested:
        return not_tested("")
    result["verdict"] = verdict(claim.expect, ci, claim.margin)
    if ci is None:
        result["why"] = "one seed: no interval"
    return result


def claims_of(results: list[Result], inputs: list[str] | None = None) -> list[Claim]:
    """The claims the study declares: as scripts/run_study.py recorded them in the study's folder
    (the experiment config's current ``claims:``), else as the runs' records hold them, once each."""
    plan = read_plan(inputs or [])
    specs = (
        plan["claims"] if plan and "claims" in plan else [c for r in results for c in r.run.config.get("claims") or []]
    )
    found: dict[str, Claim] = {}
    for spec in specs:
        found.setdefault(spec["claim"], Claim(**spec))
    return list(found.values())


def _fmt(value, spec: str = ".3g") -> str:
    return "–" if value is None else format(value, spec)


def claims_table(evaluated: list[dict]) -> str:
    if not evaluated:
        return "These runs' experiment config declares no claims (`claims:` in configs/experiment/)."
    lines = [
        "| claim | source | statistic | arm vs against | arm − against [95% CI] | paired p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in evaluated:
        ci = f" [{c['ci95'][0]:+.3g}, {c['ci95'][1]:+.3g}]" if c.get("ci95") else ""
        numbers = (
            f"{_fmt(c['value_arm'])} vs {_fmt(c['value_against'])}" if "value_arm" in c else "–",
            f"{c['difference']:+.3g}{ci}" if "difference" in c else "–",
        )
        why = f" ({c['why']})" if c.get("why") else ""
        lines.append(
            f"| {c['claim']} (expect {c['expect']}) | {c['source']} | {c['statistic']} | {c['arm']} vs {c['against']}: "
            f"{numbers[0]} | {numbers[1]} | {_fmt(c.get('p'))} | **{c['verdict']}**{why} |"
        )
    return "\n".join(lines)


def against_baseline(study: Study, variant: str) -> dict:
    """The variant's held-out best loss minus the baseline's, paired by seed (each at its own best
    rate): the mean difference, its 95% bootstrap interval over seeds and the paired p-value."""
    base = study.baseline
    seeds = [
        s for s in study.seeds if study.best_loss(variant, [s]) is not None and study.best_loss(base, [s]) is not None
    ]
    diffs = [study.best_loss(variant, [s]) - study.best_loss(base, [s]) for s in seeds]
    if not diffs:
        return {"difference": None, "ci95": None, "p": None, "seeds": 0}
    return {
        "difference": statistics.fmean(diffs),
        "ci95": bootstrap_ci(diffs) if len(diffs) > 1 else None,
        "p": paired_p_value(
            [study.best_loss(variant, [s]) for s in seeds], [study.best_loss(base, [s]) for s in seeds]
        ),
        "seeds": len(seeds),
    }


def interval_text(ci, spec: str = ".3f") -> str:
    """`` [low, high]`` of a 95% interval, or nothing when there is none (one seed)."""
    return f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else ""


def observations(study: Study) -> list[str]:
    """What the numbers show for every variant, before any claim."""
    summaries, baseline = study.summaries, study.baseline
    base = summaries[baseline]
    ranked = sorted(summaries.values(), key=lambda s: s.sensitivity)
    lines = [
        "LR sensitivity over the common grid, lowest first: "
        + ", ".join(
            f"{s.variant} {s.sensitivity:.3f}" + (" (did not train)" if s.variant in study.untrained else "")
            for s in ranked
        )
        + f". The baseline ({baseline}) reaches its best at lr {base.best_lr:g}."
    ]
    if study.untrained:
        rule = (
            f"not {TRAINED_MARGIN} nats below the unigram loss of the validation windows ({study.unigram_loss:.3f})"
            if study.unigram_loss is not None
            else f"more than {UNTRAINED_GAP} nats above {baseline}'s"
        )
        lines.append(
            f"{', '.join(sorted(study.untrained))}: best loss {rule} at every learning rate, so they did not train "
            "in this budget; their low LR sensitivity means equally poor at every rate, not stable."
        )
    edge = [s.variant for s in summaries.values() if not s.rates[0] < s.best_lr < s.rates[-1]]
    if edge:
        lines.append(
            f"Best rate at an edge of the rates run even after the extra rates: {', '.join(edge)}; "
            "their best loss is an upper bound."
        )
    for s in summaries.values():
        if s.variant == baseline:
            continue
        c = against_baseline(study, s.variant)
        if c["difference"] is None:
            continue
        evidence = f"paired p = {c['p']:.3g}" if c["p"] is not None else "one seed: no interval"
        diverged = ", ".join(f"{lr:g}" for lr in s.diverged) or "none"
        lines.append(
            f"{s.variant}: held-out best loss {c['difference']:+.3f}{interval_text(c['ci95'], '+.3f')} against {baseline} "
            f"over {c['seeds']} paired seeds ({evidence}); diverged at lr {diverged}."
        )
    return lines


def by_model(results: list[Result]) -> dict[str, list[Result]]:
    """The results of each model (by its config name), in the order the models first appear."""
    grouped: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        grouped[r.run.config.get("model", {}).get("name", "")].append(r)
    return dict(grouped)


def write_report(
    inputs: list[str], out: Path, metric: str, speed: Path | None, baseline: str, model: str | None = None
) -> Path:
    results, skipped = load_results(inputs, metric)
    models = by_model(results)
    chosen = model or max(models, key=lambda name: len(models[name]))
    if chosen not in models:
        raise RunsError(f"no runs of model {chosen!r} here; the models are: {', '.join(models)}")
    results = models[chosen]
    others = {name: len(rs) for name, rs in models.items() if name != chosen}
    study = Study(results, baseline, planned_grid(inputs))
    summaries, lrs, seeds = study.summaries, study.lrs, study.seeds
    evaluated = [evaluate_claim(claim, study) for claim in claims_of(results, inputs)]
    out.mkdir(parents=True, exist_ok=True)
    plot_loss_vs_lr(results, out / "loss_vs_lr.png")
    survived, above = study.survived_lr, study.lr_above
    plot_attention_logits(results, [lr for lr in (survived, above) if lr is not None], out / "attention_logits.png")
    base = summaries[baseline]
    plot_depth_and_kurtosis(results, base.best_lr, out / "depth.png", out / "feature_kurtosis.png")

    table = [
        f"| variant | best lr (rates run) | held-out loss at best lr [95% CI] (seeds) | Δ vs {baseline}, paired [95% CI] "
        "| LR sensitivity [95% CI] | trained | diverged at lr | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(lrs),
    ]
    data = study_json(study, metric, evaluated)
    variants_json = data["variants"]
    for s in summaries.values():
        v = variants_json[s.variant]
        best, sens = v["best_loss"], v["lr_sensitivity"]
        c = against_baseline(study, s.variant) if s.variant != baseline else None
        delta = "–" if not c or c["difference"] is None else f"{c['difference']:+.3f}{interval_text(c['ci95'], '+.3f')}"
        rates = f"{s.rates[0]:g}–{s.rates[-1]:g}" + ("" if v["best_lr_inside"] else ", at an edge")
        cells = [f"{s.losses_by_lr[lr]:.3f}" if lr in s.losses_by_lr else "" for lr in lrs]
        table.append(
            f"| {s.variant} | {s.best_lr:g} ({rates}) | {best['mean']:.3f}{interval_text(best['ci95'])} ({best['seeds']}) | "
            f"{delta} | {sens['value']:.3f}{interval_text(sens['ci95'])} | {'yes' if v['trained'] else '**no**'} | "
            f"{', '.join(f'{lr:g}' for lr in s.diverged) or '–'} | " + " | ".join(cells) + " |"
        )
    logit_note = (
        f"at lr {survived:g} (the highest the baseline survives)"
        + (f" and {above:g} (the next one up)" if above else " (it survives every rate, so there is none above)")
        if survived
        else "(the baseline diverged at every rate)"
    )
    unigram_line = (
        f"unigram loss of the validation windows {study.unigram_loss:.3f} (a variant trained when its best is "
        f"{TRAINED_MARGIN} nats below it: {study.unigram_loss - TRAINED_MARGIN:.3f})"
        if study.unigram_loss is not None
        else "no unigram loss recorded"
    )
    shared = shared_switches([r.run.config["variant"] for r in results])
    recipe = f" Every variant's label also has `{'-'.join(shared)}`, left out below." if shared else ""
    report = f"""# Stability study: norm variants across learning rates

{len(results)} runs of {len(summaries)} variants. The common grid: {len(study.grid)} learning rates
({", ".join(f"{lr:g}" for lr in study.grid)}); further rates where a variant's best sat at an edge; seeds
{", ".join(map(str, seeds))}, paired across variants (a seed fixes the data order and, where shapes agree, the initial weights).
Metric `{metric}` on the selection windows, initial loss ln(vocabulary) = {results[0].initial_loss:.3f},
{unigram_line}.{recipe}

![final loss against learning rate](loss_vs_lr.png)

{chr(10).join(table)}

Each variant's best rate is chosen on `{metric}` (the selection windows) over the seeds it ran at every
rate; its loss there is reported on the held-out windows (`{HELDOUT_LOSS}`, disjoint from the selection
windows), with a 95% bootstrap interval over seeds. Δ: held-out best loss minus the baseline's, paired by
seed. Per-rate columns: {metric} capped at the initial loss (a diverged run counts as the initial loss),
mean over seeds. LR sensitivity (Wortsman et al. 2023, Sec. 3.1): mean over the common grid of (capped
loss − the best of them), on the grid seeds; the interval resamples those seeds.

## What the numbers show

{chr(10).join("- " + line for line in observations(study))}

## Claims

Each claim as the experiment config declares it (arms chosen by config fields), evaluated on
these runs: the arm's statistic against the other's, their difference paired by seed with a
95% bootstrap interval over seeds and a paired t-test, and the verdict the interval supports.

{claims_table(evaluated)}

## Attention logits

The largest pre-softmax attention logit (max over layers) against step, {logit_note}:

![attention logits](attention_logits.png)

## The residual stream, massive activations and attention sinks with depth, and outlier features

At lr {base.best_lr:g} (the baseline's best), end of training:

![stream RMS, massive activations and attention sinks against depth](depth.png)

![feature kurtosis over training](feature_kurtosis.png)

## Training speed

{speed_table(speed, list(summaries))}
"""
    if others:
        report += (
            f"\nThis report is of model {chosen}; these folders also hold "
            + ", ".join(f"{n} runs of {name}" for name, n in others.items())
            + " (`--size` compares the models, `--model` reports on another).\n"
        )
    if skipped:
        report += "\n## Skipped\n\n" + "\n".join(f"- {message}" for message in skipped) + "\n"
    (out / "report.md").write_text(report)
    (out / "study.json").write_text(json.dumps(data, indent=1))
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A learning-rate study's report: norm variants across learning rates, and its claims."
    )
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--speed", type=Path, default=None, help="a results.json from scripts/bench_variants.py")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--model", default=None, help="the model to report on (default: the one with the most runs)")
    parser.add_argument("--size", action="store_true", help="compare LR sensitivity across the models (by_size)")
    args = parser.parse_args(argv)
    try:
        if args.size:
            from analysis.study_size import write_size_report

            path = write_size_report(args.inputs, args.out, args.metric, args.baseline)
        else:
            path = write_report(args.inputs, args.out, args.metric, args.speed, args.baseline, args.model)
    except RunsError as err:
        print(f"study_report: {err}", file=sys.stderr)
        return 1
    print(path.read_text())
    print(f"wrote {args.out}")
    return 0
