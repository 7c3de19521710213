"""A learning-rate study's statistics: each variant's best rate, LR sensitivity and best loss, per seed.

Seeds have two jobs (the project's evidence rules). A variant's *selection seeds* ran every rate it
ran at: they choose its best rate (the lowest mean capped loss on the selection windows) and give
every statistic of the whole curve. Its *report seeds* ran at the best rate only, after it was
chosen: they report its loss there, on the held-out windows, free of the luck that chose it.

LR sensitivity (Wortsman et al. 2023, arXiv 2309.14322, Sec. 3.1): over the common grid, the mean of
``min(final loss, initial loss) - best of them``, where a diverged run counts as the initial loss
ln(vocabulary size). It is computed on each seed's own curve; a variant's value is the mean of its
seeds' values, so the value, its interval and the paired test describe the same numbers.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.keys import fields, metric_key
from lab.results import VAL_LOSS, Result, capped_loss, common_grid, heldout_loss
from lab.runs import Run, RunsError, latest_eval, layer_values
from lab.study_plan import best_rate
from lab.unigram import run_unigram_loss
from training.run.resume import flatten

STREAM_RMS = metric_key("act/layers.{i}/stream_rms")
ANGULAR_DISTANCE = metric_key("act/layers.{i}/angular_distance")
MAX_LOGIT = metric_key("attn/layers.{i}/max_logit")
GRAD_BY_LAYER = metric_key("grad/{part}").replace("{part}", "layers.{i}")
SATURATED = metric_key("act/{norm}/saturated")
SINK_MASS = metric_key("attn/layers.{i}/sink_mass")
MASSIVE_RATIO = metric_key("act/layers.{i}/massive_ratio")

# A variant trained when its best loss is at least this far (nats) below the unigram loss of the
# validation windows (lab/unigram.py); runs with no line recorded (neither by the run nor by its
# study) fall back to UNTRAINED_GAP above the baseline's best. Either way, a variant that did not train has a low
# LR sensitivity only because every rate is equally poor.
TRAINED_MARGIN = 0.3
UNTRAINED_GAP = 0.5
# LR sensitivity compares variants over the rates they all ran; with fewer in common (each arm on its
# own grid) there is no curve to compare.
MIN_COMMON_RATES = 3


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


def deep_minus_first_half(values: list[float]) -> float | None:
    """The mean over the deeper half of the blocks minus the mean over the first half (an odd count's middle
    block in neither): below 0 when the deeper layers change the stream less (the Curse of Depth's reading)."""
    half = len(values) // 2
    if half == 0:
        return None
    return statistics.fmean(values[-half:]) - statistics.fmean(values[:half])


def skip_deltas(run: Run) -> list[float]:
    """Each block's skip delta from the newest eval.json entry (``eval.py layer_importance=true``), or []."""
    return ((latest_eval(run) or {}).get("layer_importance") or {}).get("skip_delta") or []


def first_step_at(curve: list[tuple[int, float]], target: float) -> float:
    """The step at which a validation curve (step, loss) first reaches ``target``, interpolated linearly
    between the evaluation above it and the one at or below it (evaluations every few steps would
    otherwise round every arm's steps up to the next one). The target is one the curve reaches."""
    previous = None
    for step, loss in curve:
        if loss <= target:
            if previous is None:
                return float(step)
            step_before, loss_before = previous
            return step_before + (loss_before - target) / (loss_before - loss) * (step - step_before)
        previous = step, loss
    raise ValueError(f"the curve never reaches {target}")


def final_stream_growth(r: Result) -> float | None:
    """The stream's RMS after the last block over its RMS after the first, at the end of training."""
    rms = r.run.by_layer(STREAM_RMS)
    return rms[-1] / rms[0] if rms else None


def final_sink_mass(r: Result) -> float | None:
    """The attention weight on position 0, averaged over the layers, at the end of training."""
    values = r.run.by_layer(SINK_MASS)
    return statistics.fmean(values) if values else None


def final_massive_ratio(r: Result) -> float | None:
    """The largest activation over the median magnitude, in the layer where it is largest, at the end of training."""
    values = r.run.by_layer(MASSIVE_RATIO)
    return max(values) if values else None


def final_max_attn_logit(r: Result) -> float | None:
    """The largest attention logit over the layers at the last step that logged them."""
    points = over_layers(r.run, MAX_LOGIT)
    return points[-1][1] if points else None


def over_layers(run: Run, template: str, reduce=max) -> list[tuple[int, float]]:
    """(step, ``reduce`` over layers of ``template``) for every row that logged layer 0."""
    return [(row["step"], reduce(values)) for row in run.rows if (values := layer_values(row, template))]


@dataclass
class ArmSummary:
    arm: str
    losses_by_lr: dict[float, float]  # mean capped loss over the selection seeds, at every rate the variant ran
    selection_seeds: list[int]  # ran every rate of the variant: they choose its best rate
    report_seeds: list[int]  # ran at the best rate only: they report its loss there
    best_lr: float
    selection_best: float  # mean capped loss of the selection seeds at the best rate (decides "trained")
    diverged: list[float]  # learning rates at which some seed diverged

    @property
    def rates(self) -> list[float]:
        return sorted(self.losses_by_lr)


def summarize(results: list[Result]) -> dict[str, ArmSummary]:
    by_arm: dict[str, dict[float, list[Result]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_arm[r.arm][r.lr].append(r)
    summaries = {}
    for arm, by_lr in sorted(by_arm.items()):
        runs = [r for rs in by_lr.values() for r in rs]
        selection = sorted(set.intersection(*({r.seed for r in rs} for rs in by_lr.values())))
        if not selection:
            raise RunsError(
                f"{arm}: no seed ran at every one of its rates {sorted(by_lr)}, so no seed can choose its best "
                "rate; rerun the study (python -m lab study) to complete its grid"
            )
        best_lr = best_rate({(r.lr, r.seed): capped_loss(r) for r in runs}, selection)
        losses = {lr: statistics.fmean(capped_loss(r) for r in rs if r.seed in selection) for lr, rs in by_lr.items()}
        summaries[arm] = ArmSummary(
            arm,
            dict(sorted(losses.items())),
            selection,
            sorted({r.seed for r in by_lr[best_lr]} - set(selection)),
            best_lr,
            losses[best_lr],
            sorted(lr for lr, rs in by_lr.items() if any(r.diverged_at is not None for r in rs)),
        )
    return summaries


class Study:
    """The grid's results, per variant, with statistics computed on any list of seeds (one value per
    seed for a paired test, or their mean)."""

    def __init__(self, results: list[Result], baseline: str, planned_grid: list[float] | None = None) -> None:
        self.results = results
        self.grid = common_grid(results, planned_grid)
        self.summaries = summarize(results)
        if baseline not in self.summaries:
            raise RunsError(f"the baseline {baseline!r} is not among the variants: {', '.join(self.summaries)}")
        self.baseline = baseline
        self.cells: dict[tuple[str, float, int], Result] = {(r.arm, r.lr, r.seed): r for r in results}
        self.lrs = sorted({r.lr for r in results})
        base = self.summaries[baseline]
        self.unigram_loss = next((u for r in results if (u := run_unigram_loss(r.run)) is not None), None)
        if self.unigram_loss is not None:
            line = self.unigram_loss - TRAINED_MARGIN
            self.untrained = {v for v, s in self.summaries.items() if s.selection_best > line}
        else:
            gap = UNTRAINED_GAP
            self.untrained = {v for v, s in self.summaries.items() if s.selection_best - base.selection_best > gap}
        self.reference_lr = self._highest_trained_rate(baseline)

    def trained_at(self, result: Result) -> bool:
        """Whether one run trained: it did not diverge and ended below the study's line."""
        if result.diverged_at is not None:
            return False
        if self.unigram_loss is None:
            return capped_loss(result) < result.initial_loss
        return capped_loss(result) <= self.unigram_loss - TRAINED_MARGIN

    def _highest_trained_rate(self, arm: str) -> float | None:
        """The highest grid rate at which every selection seed of ``variant`` trained: where a statistic
        that grows with the rate (the attention logits) is compared, so the baseline is a model there."""
        seeds = self.summaries[arm].selection_seeds
        trained = [lr for lr in self.grid if all(self.trained_at(r) for r in self._runs(arm, lr, seeds))]
        return max(trained) if trained else None

    def seeds_of(self, arm: str) -> list[int]:
        """Every seed the variant ran."""
        summary = self.summaries[arm]
        return sorted({*summary.selection_seeds, *summary.report_seeds})

    def best_inside(self, arm: str) -> bool:
        """Whether the variant's best rate lies strictly inside the rates it ran at."""
        rates = self.summaries[arm].rates
        return rates[0] < self.summaries[arm].best_lr < rates[-1]

    def config(self, arm: str) -> dict:
        return next(r.run for r in self.results if r.arm == arm).config

    def arm_with(self, fields: dict) -> str | None:
        """The one variant whose runs have every config value in ``fields`` (None if none; refused if several)."""
        found = [v for v in self.summaries if matches(flatten(self.config(v)).__getitem__, fields)]
        if len(found) > 1:
            raise RunsError(f"the claim's arm {fields} matches several variants ({', '.join(found)}): name more fields")
        return found[0] if found else None

    def _runs(self, arm: str, lr: float, seeds) -> list[Result]:
        return [self.cells[(arm, lr, s)] for s in seeds if (arm, lr, s) in self.cells]

    def lr_sensitivity(self, arm: str, seeds) -> float | None:
        """The mean over ``seeds`` of each seed's own LR sensitivity over the common grid; None unless every
        seed ran every grid rate."""
        per_seed = []
        for seed in seeds:
            runs = [self.cells.get((arm, lr, seed)) for lr in self.grid]
            if not runs or None in runs:
                return None
            per_seed.append(lr_sensitivity({r.lr: capped_loss(r) for r in runs}))
        return statistics.fmean(per_seed) if per_seed else None

    def _mean_at(self, arm: str, lr: float, seeds, value_of: Callable[[Result], float | None]) -> float | None:
        """The mean of ``value_of`` over the variant's runs of ``seeds`` at ``lr``; None unless every seed has it."""
        values = [v for r in self._runs(arm, lr, seeds) if (v := value_of(r)) is not None]
        return statistics.fmean(values) if values and len(values) == len(list(seeds)) else None

    def best_loss(self, arm: str, seeds) -> float | None:
        """The mean loss of ``seeds`` at the variant's best rate, on the held-out windows where logged."""
        return self._mean_at(arm, self.summaries[arm].best_lr, seeds, heldout_loss)

    def stream_growth(self, arm: str, seeds) -> float | None:
        """Last-block over first-block stream RMS at the end of training, at the baseline's best rate."""
        return self._mean_at(arm, self.summaries[self.baseline].best_lr, seeds, final_stream_growth)

    def stream_growth_at_best(self, arm: str, seeds) -> float | None:
        """Last-block over first-block stream RMS at the end of training, at the variant's own best rate: each
        arm as it trains best, where the baseline's rate can leave another placement under-trained."""
        return self._mean_at(arm, self.summaries[arm].best_lr, seeds, final_stream_growth)

    def sink_mass_at_best(self, arm: str, seeds) -> float | None:
        """Mean attention weight on position 0 over the layers at the end of training, at the variant's best rate."""
        return self._mean_at(arm, self.summaries[arm].best_lr, seeds, final_sink_mass)

    def massive_ratio_at_best(self, arm: str, seeds) -> float | None:
        """The largest layer's massive-activation ratio at the end of training, at the variant's best rate."""
        return self._mean_at(arm, self.summaries[arm].best_lr, seeds, final_massive_ratio)

    def steps_to_common_loss(self, arm: str, against: str, seeds) -> tuple[float, float] | None:
        """Each arm's share of its steps, at its own best rate, to first reach the validation loss that both
        reach: the higher of their two final losses, same seed (means over ``seeds``). The arm that ends
        lower gets there first; the other at its end, or earlier where its curve dips below its final loss.
        So neither side's share is fixed in advance, and no run is censored: a claim on it can disagree."""
        shares = []
        for seed in seeds:
            runs = [self._runs(v, self.summaries[v].best_lr, [seed]) for v in (arm, against)]
            if not all(runs) or any(r.diverged_at is not None for (r,) in runs):
                return None
            curves = [[(row["step"], row[VAL_LOSS]) for row in r.run.rows if VAL_LOSS in row] for (r,) in runs]
            if not all(curves):
                return None
            target = max(curve[-1][1] for curve in curves)
            shares.append(
                [first_step_at(curve, target) / r.run.config["train"]["max_steps"] for curve, (r,) in zip(curves, runs)]
            )
        if not shares:
            return None
        return statistics.fmean(a for a, _ in shares), statistics.fmean(b for _, b in shares)

    def deep_half_angular_distance(self, arm: str, seeds) -> float | None:
        """How much less the deeper half of the blocks turns the stream than the first half (angular distance,
        deeper minus first), at the end of training at the variant's own best rate."""
        best_lr = self.summaries[arm].best_lr
        return self._mean_at(arm, best_lr, seeds, lambda r: deep_minus_first_half(r.run.by_layer(ANGULAR_DISTANCE)))

    def deep_half_skip_delta(self, arm: str, seeds) -> float | None:
        """How much less the loss rises without a deeper-half block than without a first-half one (skip delta,
        deeper minus first, from eval.py layer_importance=true), at the variant's own best rate."""
        best_lr = self.summaries[arm].best_lr
        return self._mean_at(arm, best_lr, seeds, lambda r: deep_minus_first_half(skip_deltas(r.run)))

    def max_attn_logit(self, arm: str, seeds) -> float | None:
        """The largest attention logit (over layers) at the last stats step, at the highest rate at which
        the baseline trained."""
        if self.reference_lr is None:
            return None
        return self._mean_at(arm, self.reference_lr, seeds, final_max_attn_logit)


@dataclass(frozen=True)
class Statistic:
    compute: Callable  # a Study method: (study, variant, seeds) -> value or None
    seeds: str  # "selection" (a statistic of the whole curve) or "report" (a loss at the chosen rate)
    where: str  # where it is read, for the report
    # compute(study, arm, against, seeds) -> (arm's value, against's value): a statistic of the pair (a common target)
    pairwise: bool = False


# A claim's `statistic` is one of these.
STATISTICS: dict[str, Statistic] = {
    "lr_sensitivity": Statistic(Study.lr_sensitivity, "selection", "over the common grid"),
    "best_loss": Statistic(Study.best_loss, "report", "at each arm's own best rate, held-out windows"),
    "stream_growth": Statistic(Study.stream_growth, "selection", "at the baseline's best rate"),
    "stream_growth_at_best": Statistic(Study.stream_growth_at_best, "report", "at each arm's own best rate"),
    "sink_mass_at_best": Statistic(Study.sink_mass_at_best, "report", "at each arm's own best rate, end of training"),
    "massive_ratio_at_best": Statistic(
        Study.massive_ratio_at_best, "report", "at each arm's own best rate, end of training, largest layer"
    ),
    "max_attn_logit": Statistic(Study.max_attn_logit, "selection", "at the highest rate the baseline trained"),
    "steps_to_common_loss": Statistic(
        Study.steps_to_common_loss,
        "report",
        "share of its steps to the higher of the two final losses, same seed, each at its best rate",
        pairwise=True,
    ),
    "deep_half_angular_distance": Statistic(
        Study.deep_half_angular_distance, "report", "deeper half minus first half of the blocks, at its best rate"
    ),
    "deep_half_skip_delta": Statistic(
        Study.deep_half_skip_delta, "report", "deeper half minus first half of the blocks, at its best rate"
    ),
}


def seeds_for(study: Study, statistic: Statistic, *arms: str) -> list[int]:
    """The seeds that every one of ``variants`` has for ``statistic``, in the role it needs."""
    role = "selection_seeds" if statistic.seeds == "selection" else "report_seeds"
    return sorted(set.intersection(*(set(getattr(study.summaries[v], role)) for v in arms)))


def per_seed(study: Study, statistic: Statistic, arm: str, seeds: list[int]) -> list[float]:
    """The statistic on each seed alone, for the seeds that have it."""
    return [v for s in seeds if (v := statistic.compute(study, arm, [s])) is not None]


def explanation(study: Study, arm: str) -> str:
    """What a variant that did not train looks like from its own probes at its best rate (gradient norms
    by layer, the stream's growth, DyT/Derf saturation): symptoms, not a diagnosis."""
    if arm not in study.untrained:
        return ""
    summary = study.summaries[arm]
    run = study._runs(arm, summary.best_lr, summary.selection_seeds)[0].run
    rule = (
        f"not {TRAINED_MARGIN} nats below the unigram loss {study.unigram_loss:.3f}"
        if study.unigram_loss is not None
        else f"more than {UNTRAINED_GAP} nats above the baseline's best"
    )
    parts = [f"best loss {summary.selection_best:.3f} at lr {summary.best_lr:g}, {rule}"]
    grads = run.by_layer(GRAD_BY_LAYER)
    if grads:
        parts.append("gradient norm by layer " + ", ".join(f"{g:.2g}" for g in grads))
    rms = run.by_layer(STREAM_RMS)
    if rms:
        parts.append(f"stream RMS {rms[0]:.3g} after block 1, {rms[-1]:.3g} after the last")
    saturated = [v for k, v in run.rows[-1].items() if fields(SATURATED, k) is not None]
    if saturated:
        parts.append(f"mean saturation of its DyT/Derf norms {statistics.fmean(saturated):.0%}")
    return "; ".join(parts)
