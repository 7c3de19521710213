"""The stability study's report: which norm variants train well over which learning rates, and why.

    python train.py -m +experiment=stability
    python scripts/study_report.py runs/stability --out study/ --speed bench_out/variants/results.json

In the style of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") and Peri-LN (Kim et al. 2025). Reads every run under the inputs (runs missing
metrics are named and skipped) and writes into --out:

- loss_vs_lr.png: final validation loss and bits per byte against learning rate, one curve per
  variant, diverged runs marked at the initial loss;
- report.md: per variant the best learning rate and loss (mean ± std over seeds, Welch's p
  against the baseline from two seeds up), the LR sensitivity, divergences, the speed table when
  --speed names a scripts/bench_variants.py result, and conclusions drawn from these numbers;
- attention_logits.png: the largest attention logit against step, at the highest learning rate
  the baseline survives and the next one up;
- stream_rms_depth.png: the residual stream's RMS against depth at the end of training;
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
from dataclasses import dataclass
from pathlib import Path

from compare_runs import Run, RunsError, check_comparable, find_run_dirs, load_run, welch_p_value
from plots import pyplot, save

BASELINE = "rmsnorm"


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
    results, skipped = [], []
    for path in find_run_dirs(inputs):
        try:
            run = load_run(path)
        except RunsError as err:
            skipped.append(str(err))
            continue
        diverged = next((row["step"] for row in run.rows if row.get("diverged")), None)
        cfg = run.config
        results.append(Result(run, cfg["variant"], float(cfg["train"]["lr"]), cfg["seed"], run.last(metric), diverged))
    if not results:
        raise RunsError(f"no run under {', '.join(inputs)} has metrics to report on")
    check_comparable([r.run for r in results], metric)
    return results, skipped


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
    losses_by_lr: dict[float, float]  # mean capped loss over seeds
    best_lr: float
    best_values: list[float]  # per seed, at the best learning rate
    sensitivity: float
    diverged: list[float]  # learning rates at which some seed diverged

    @property
    def best_mean(self) -> float:
        return statistics.fmean(self.best_values)

    @property
    def best_std(self) -> float:
        return statistics.pstdev(self.best_values)


def summarize(results: list[Result]) -> dict[str, VariantSummary]:
    by_variant: dict[str, dict[float, list[Result]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_variant[r.variant][r.lr].append(r)
    summaries = {}
    for variant, by_lr in sorted(by_variant.items()):
        losses = {lr: statistics.fmean(capped_loss(r) for r in runs) for lr, runs in sorted(by_lr.items())}
        best_lr = min(losses, key=losses.get)
        summaries[variant] = VariantSummary(
            variant,
            losses,
            best_lr,
            [capped_loss(r) for r in by_lr[best_lr]],
            lr_sensitivity(losses),
            sorted(lr for lr, runs in by_lr.items() if any(r.diverged_at is not None for r in runs)),
        )
    return summaries


def plot_loss_vs_lr(results: list[Result], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "val/loss", "final validation loss (nats/token)"), (axes[1], "val/bpb", "bpb")):
        for variant in sorted({r.variant for r in results}):
            runs = [r for r in results if r.variant == variant]
            lrs = sorted({r.lr for r in runs})
            means = []
            for lr in lrs:
                values = [r.run.last(key) for r in runs if r.lr == lr and r.diverged_at is None]
                means.append(statistics.fmean(values) if values and None not in values else float("nan"))
            (line,) = ax.plot(lrs, means, marker="o", label=variant)
            if key == "val/loss":
                diverged = sorted({r.lr for r in runs if r.diverged_at is not None})
                ax.scatter(diverged, [runs[0].initial_loss] * len(diverged), marker="x", s=80, color=line.get_color())
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title("x: diverged (plotted at the initial loss)")
    axes[0].legend(fontsize=8, loc="center left")  # clear of the diverged marks along the top
    save(fig, path)


def _max_over_layers(run: Run, prefix: str, suffix: str) -> list[tuple[int, float]]:
    by_step: dict[int, float] = {}
    for row in run.rows:
        values = [v for k, v in row.items() if k.startswith(prefix) and k.endswith(suffix) and isinstance(v, float)]
        if values:
            by_step[row["step"]] = max(values)
    return sorted(by_step.items())


def surviving_lrs(results: list[Result], baseline: str) -> tuple[float | None, float | None]:
    """The highest learning rate at which the baseline did not diverge, and the next one up (or None)."""
    lrs = sorted({r.lr for r in results})
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


def plot_attention_logits(results: list[Result], lrs: list[float], path: Path) -> dict[tuple[str, float], float]:
    """Max attention logit (over layers) against step; returns the last value per (variant, lr)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(lrs), figsize=(6 * len(lrs), 4.5), squeeze=False)
    last = {}
    for ax, lr in zip(axes[0], lrs):
        for r in sorted(
            (r for r in results if r.lr == lr and r.seed == min(x.seed for x in results)), key=lambda r: r.variant
        ):
            points = _max_over_layers(r.run, "attn/", "/max_logit")
            if points:
                ax.plot(*zip(*points), label=r.variant + (" (diverged)" if r.diverged_at else ""))
                last[(r.variant, lr)] = points[-1][1]
        _log_axes(ax, "step", "attention logit", f"lr {lr:g}: largest pre-softmax attention logit (max over layers)")
    save(fig, path)
    return last


def plot_depth_and_kurtosis(results: list[Result], lr: float, depth_path: Path, kurtosis_path: Path) -> dict:
    """The Peri-LN figure (stream RMS against depth) and feature kurtosis over training, at one learning rate."""
    plt = pyplot()
    chosen = sorted(
        (r for r in results if r.lr == lr and r.seed == min(x.seed for x in results)), key=lambda r: r.variant
    )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    growth = {}
    for r in chosen:
        rms = r.run.by_layer("act/layers.{}/stream_rms")  # at the last step that logged it
        if rms:
            ax.plot(range(1, len(rms) + 1), rms, marker="o", label=r.variant)
            growth[r.variant] = rms[-1] / rms[0]
    _log_axes(ax, "block (depth)", "residual stream RMS leaving the block", f"end of training, lr {lr:g}")
    save(fig, depth_path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in chosen:
        by_step = defaultdict(list)
        for row in r.run.rows:
            for k, v in row.items():
                if k.endswith("/stream_feature_kurtosis") and isinstance(v, float):
                    by_step[row["step"]].append(v)
        if by_step:
            steps = sorted(by_step)
            ax.plot(steps, [statistics.fmean(by_step[s]) for s in steps], label=r.variant)
    ylabel = "feature kurtosis of the residual stream (mean over blocks)"
    _log_axes(ax, "step", ylabel, f"outlier features (3 = none), lr {lr:g}")
    save(fig, kurtosis_path)
    return growth


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


def _p(a: list[float], b: list[float]) -> str:
    p = welch_p_value(a, b)
    return "–" if p is None else f"{p:.3g}"


# A variant whose best loss stays this far (nats) above the baseline's did not really train at any
# rate, and its LR sensitivity is low only because every rate is equally poor.
UNTRAINED_GAP = 0.5


def conclusions(summaries: dict[str, VariantSummary], baseline: str, logits: dict, logit_lr, growth: dict) -> list[str]:
    """Statements the numbers support, each next to what the papers report."""
    base = summaries[baseline]
    seeds = len(base.best_values)
    untrained = {v for v, s in summaries.items() if s.best_mean - base.best_mean > UNTRAINED_GAP}
    lines = []
    ranked = sorted(summaries.values(), key=lambda s: s.sensitivity)
    lines.append(
        "LR sensitivity, lowest first: "
        + ", ".join(
            f"{s.variant} {s.sensitivity:.3f}" + (" (did not train)" if s.variant in untrained else "") for s in ranked
        )
        + f". The baseline ({baseline}) reaches its best loss {base.best_mean:.4f} at lr {base.best_lr:g}."
    )
    if untrained:
        lines.append(
            f"{', '.join(sorted(untrained))}: best loss more than {UNTRAINED_GAP} nats above {baseline}'s at every "
            "learning rate, so they did not train in this budget; their low LR sensitivity means equally poor at "
            "every rate, not stable."
        )
    for s in summaries.values():
        if s.variant == baseline:
            continue
        diff = s.best_mean - base.best_mean
        p = welch_p_value(s.best_values, base.best_values)
        evidence = (
            f"Welch p = {p:.3g}" if p is not None else f"{seeds} seed: no p-value, a difference this size may be noise"
        )
        lines.append(
            f"{s.variant}: best loss {diff:+.4f} against {baseline} ({evidence}); diverged at lr {', '.join(f'{lr:g}' for lr in s.diverged) or 'none'}."
        )

    qk = next((v for v in summaries if v.startswith(baseline + "-qk")), None)
    if qk:
        lower = summaries[qk].sensitivity < base.sensitivity
        text = (
            f"QK-norm ({qk}): Wortsman et al. report that it keeps attention logits from growing and lowers LR "
            f"sensitivity. Here its sensitivity is {summaries[qk].sensitivity:.3f} against {base.sensitivity:.3f}: "
            + ("agrees." if lower else "does not agree at this scale.")
        )
        if (qk, logit_lr) in logits and (baseline, logit_lr) in logits:
            a, b = logits[(qk, logit_lr)], logits[(baseline, logit_lr)]
            text += f" Its largest attention logit at lr {logit_lr:g} ends at {a:.3g} against {b:.3g} " + (
                "(bounded, as reported)." if a < b else "(not smaller here)."
            )
        lines.append(text)
    post = next((v for v in summaries if v == baseline + "-post"), None)
    if post in untrained:
        lines.append(
            f"Post-norm ({post}): expected to be the hardest placement to train as depth grows (it needs careful "
            "warm-up; Xiong et al. 2020). Here it did not train at any learning rate, which fits that expectation, "
            "though this grid cannot tell slow training from instability."
        )
    elif post:
        worse = summaries[post].sensitivity > base.sensitivity
        lines.append(
            f"Post-norm ({post}): expected to be the least stable placement as depth grows. Its sensitivity is "
            f"{summaries[post].sensitivity:.3f} against pre-norm's {base.sensitivity:.3f}: "
            + ("agrees." if worse else "does not agree at this depth and length.")
        )
    peri = next((v for v in summaries if v == baseline + "-peri"), None)
    if peri and peri in growth and baseline in growth:
        flatter = growth[peri] < growth[baseline]
        lines.append(
            f"Peri-LN (Kim et al. 2025) reports the residual stream's scale growing with depth under pre-norm and "
            f"staying controlled under peri-norm. Last-block over first-block stream RMS here: pre-norm "
            f"{growth[baseline]:.2f}x, peri-norm {growth[peri]:.2f}x: " + ("agrees." if flatter else "does not agree.")
        )
    if "dyt" in summaries:
        diff = summaries["dyt"].best_mean - base.best_mean
        verdict = (
            "does not agree at this budget (the paper tunes alpha per role for LLMs, 0.8/0.2, and scales the "
            "embeddings by a learned factor; this grid uses alpha_init 0.5 and neither)"
            if "dyt" in untrained
            else "a gap this size " + ("is small" if abs(diff) < 0.05 else "remains")
        )
        lines.append(
            f"DyT (Zhu et al. 2025) reports matching normalized Transformers. Here its best loss is {diff:+.4f} "
            f"from {baseline}'s: {verdict}."
        )
    return lines


def write_report(inputs: list[str], out: Path, metric: str, speed: Path | None, baseline: str) -> Path:
    results, skipped = load_results(inputs, metric)
    summaries = summarize(results)
    if baseline not in summaries:
        raise RunsError(f"the baseline {baseline!r} is not among the variants: {', '.join(summaries)}")
    out.mkdir(parents=True, exist_ok=True)
    plot_loss_vs_lr(results, out / "loss_vs_lr.png")
    survived, above = surviving_lrs(results, baseline)
    logit_lrs = [lr for lr in (survived, above) if lr is not None]
    logits = plot_attention_logits(results, logit_lrs, out / "attention_logits.png")
    growth = plot_depth_and_kurtosis(
        results, summaries[baseline].best_lr, out / "stream_rms_depth.png", out / "feature_kurtosis.png"
    )

    lrs = sorted({r.lr for r in results})
    base = summaries[baseline]
    table = [
        f"| variant | best lr | best {metric} (mean ± std) | Δ vs {baseline} | Welch p | LR sensitivity | diverged at lr | "
        + " | ".join(f"lr {lr:g}" for lr in lrs)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(lrs),
    ]
    for s in summaries.values():
        delta = "–" if s.variant == baseline else f"{s.best_mean - base.best_mean:+.4f}"
        p = "–" if s.variant == baseline else _p(s.best_values, base.best_values)
        cells = [f"{s.losses_by_lr[lr]:.3f}" if lr in s.losses_by_lr else "" for lr in lrs]
        table.append(
            f"| {s.variant} | {s.best_lr:g} | {s.best_mean:.4f} ± {s.best_std:.4f} | {delta} | {p} | "
            f"{s.sensitivity:.3f} | {', '.join(f'{lr:g}' for lr in s.diverged) or '–'} | " + " | ".join(cells) + " |"
        )
    seeds = sorted({r.seed for r in results})
    logit_note = (
        f"at lr {survived:g} (the highest the baseline survives)"
        + (f" and {above:g} (the next one up)" if above else " (it survives every rate, so there is none above)")
        if survived
        else "(the baseline diverged at every rate)"
    )
    report = f"""# Stability study: norm variants across learning rates

{len(results)} runs: {len(summaries)} variants x {len(lrs)} learning rates x {len(seeds)} seed(s), metric `{metric}`,
initial loss ln(vocabulary) = {results[0].initial_loss:.3f}.

![final loss against learning rate](loss_vs_lr.png)

{chr(10).join(table)}

Per-rate columns: {metric} capped at the initial loss (a diverged run counts as the initial loss), mean over seeds.
LR sensitivity: mean over the grid of (capped loss - the variant's best), Wortsman et al. 2023, Sec. 3.1.

## What the numbers show

{chr(10).join("- " + line for line in conclusions(summaries, baseline, logits, survived, growth))}

## Attention logits

The largest pre-softmax attention logit (max over layers) against step, {logit_note}:

![attention logits](attention_logits.png)

## The residual stream with depth, and outlier features

At lr {base.best_lr:g} (the baseline's best), end of training:

![stream RMS against depth](stream_rms_depth.png)

![feature kurtosis over training](feature_kurtosis.png)

## Training speed

{speed_table(speed, list(summaries))}
"""
    if skipped:
        report += "\n## Skipped\n\n" + "\n".join(f"- {message}" for message in skipped) + "\n"
    (out / "report.md").write_text(report)
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--speed", type=Path, default=None, help="a results.json from scripts/bench_variants.py")
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    try:
        path = write_report(args.inputs, args.out, args.metric, args.speed, args.baseline)
    except RunsError as err:
        print(f"study_report: {err}", file=sys.stderr)
        return 1
    print(path.read_text())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
