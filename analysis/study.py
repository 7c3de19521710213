"""A learning-rate study's statistics: each variant's best rate, LR sensitivity and best loss, over any seeds.

LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, Sec. 3.1): the mean over the learning-rate
grid of ``min(final loss, initial loss) - best loss``, where a diverged run counts as the initial
loss and the initial loss is that of the untrained model, ln(vocabulary size). Every statistic of
``Study`` takes the seeds to compute it on, so intervals resample whole seeds and keep runs of one
seed paired across variants.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis.keys import fields, metric_key
from analysis.results import HELDOUT_LOSS, Result, capped_loss, common_grid, heldout_loss, mean_capped
from analysis.runs import Run, RunsError, layer_values
from analysis.stats import bootstrap_ci, paired_p_value
from analysis.study_plan import best_rate
from training.run_record import flatten

STREAM_RMS = metric_key("act/layers.{i}/stream_rms")
MAX_LOGIT = metric_key("attn/layers.{i}/max_logit")
GRAD_BY_LAYER = metric_key("grad/{part}").replace("{part}", "layers.{i}")
SATURATED = metric_key("act/{norm}/saturated")


def matches(config_lookup, fields: dict[str, Any]) -> bool:
    """Whether a run's config has every ``fields`` value (``config_lookup(dotted)`` raises KeyError when absent)."""
    try:
        return all(config_lookup(key) == value for key, value in fields.items())
    except KeyError:
        return False


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


def over_layers(run: Run, template: str, reduce=max) -> list[tuple[int, float]]:
    """(step, ``reduce`` over layers of ``template``) for every row that logged layer 0."""
    return [(row["step"], reduce(values)) for row in run.rows if (values := layer_values(row, template))]


def surviving_lrs(results: list[Result], baseline: str) -> tuple[float | None, float | None]:
    """The highest learning rate at which the baseline did not diverge, and the next one up (or None)."""
    lrs = sorted({r.lr for r in results if r.variant == baseline})  # not the rates only others ran past an edge
    survived = [lr for lr in lrs if all(r.diverged_at is None for r in results if r.variant == baseline and r.lr == lr)]
    highest = max(survived) if survived else None
    above = [lr for lr in lrs if highest is not None and lr > highest]
    return highest, (above[0] if above else None)


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
            if (points := over_layers(r.run, MAX_LOGIT))
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


def heldout_best_loss(study: Study, variant: str) -> tuple[list[float], str]:
    """The variant's per-seed loss at its best rate (chosen on the selection windows), on the held-out
    windows when the runs logged them, else on the selection windows; and which key that is."""
    runs = study._runs(variant, study.summaries[variant].best_lr, study.seeds)
    heldout = [r.run.last(HELDOUT_LOSS) for r in runs]
    if runs and all(v is not None for v in heldout) and all(r.diverged_at is None for r in runs):
        return heldout, HELDOUT_LOSS
    return [capped_loss(r) for r in runs], "selection windows (no held-out windows logged)"


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
