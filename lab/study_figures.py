"""A learning-rate study's figures: loss against rate and step, attention logits, the stream with depth, outlier features."""

from __future__ import annotations

import statistics
from pathlib import Path

from lab.keys import metric_key
from lab.plots import pyplot, save
from lab.results import VAL_BPB, VAL_LOSS, Result
from lab.study import MAX_LOGIT, STREAM_RMS, over_layers

STREAM_KURTOSIS = metric_key("act/layers.{i}/stream_feature_kurtosis")
BY_DEPTH = (
    (STREAM_RMS, "residual stream RMS leaving the block"),
    (metric_key("act/layers.{i}/massive_ratio"), "massive-activation ratio (max |h| / median |h|)"),
    (metric_key("attn/layers.{i}/sink_mass"), "attention-sink mass (weight on position 0)"),
)


def plot_loss_vs_lr(results: list[Result], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], VAL_LOSS, "final validation loss (nats/token)"), (axes[1], VAL_BPB, "bpb")):
        for i, arm in enumerate(sorted({r.arm for r in results})):
            runs = [r for r in results if r.arm == arm]
            lrs = sorted({r.lr for r in runs})
            style = {"color": plt.get_cmap("tab20")(i % 20), "linestyle": ("-", "--", ":")[i // 20 % 3]}
            means = []
            for lr in lrs:
                values = [r.run.last(key) for r in runs if r.lr == lr and r.diverged_at is None]
                means.append(statistics.fmean(values) if values and None not in values else float("nan"))
            (line,) = ax.plot(lrs, means, marker="o", label=arm, **style)  # 20 colours before a style repeats
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


def plot_loss_vs_step(results: list[Result], best_lrs: dict[str, float], path: Path) -> None:
    """Validation loss against step, each variant at its own best rate, mean over the seeds that ran there."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (arm, lr) in enumerate(sorted(best_lrs.items())):
        curves: dict[int, list[float]] = {}
        for r in results:
            if r.arm == arm and r.lr == lr and r.diverged_at is None:
                for row in r.run.rows:
                    if VAL_LOSS in row:
                        curves.setdefault(row["step"], []).append(row[VAL_LOSS])
        steps = sorted(curves)
        style = {"color": plt.get_cmap("tab20")(i % 20), "linestyle": ("-", "--", ":")[i // 20 % 3]}
        ax.plot(steps, [statistics.fmean(curves[s]) for s in steps], marker=".", label=f"{arm} (lr {lr:g})", **style)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("each variant at its best rate, mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def _log_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_attention_logits(
    results: list[Result], lrs: list[float], path: Path, own_best: dict[str, float] | None = None
) -> None:
    """Max attention logit (over layers) against step of the first seed, one panel per learning rate; or one
    panel with each variant at its own best rate (``own_best``), where the variants share no rate."""
    plt = pyplot()
    first = min(x.seed for x in results)
    panels = [(f"lr {lr:g}", lambda r, lr=lr: r.lr == lr) for lr in lrs] or [
        ("each variant at its best rate", lambda r: r.lr == own_best[r.arm])
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (title, chosen) in zip(axes[0], panels):
        for r in sorted((r for r in results if r.seed == first and chosen(r)), key=lambda r: r.arm):
            points = over_layers(r.run, MAX_LOGIT)
            if points:
                ax.plot(*zip(*points), label=r.arm + (" (diverged)" if r.diverged_at else ""))
        _log_axes(ax, "step", "attention logit", f"{title}: largest pre-softmax attention logit (max over layers)")
    save(fig, path)


def plot_depth_and_kurtosis(results: list[Result], lr: float, depth_path: Path, kurtosis_path: Path) -> None:
    """The Peri-LN figure (stream RMS against depth) beside the massive-activation ratio and the
    attention-sink mass against depth, and feature kurtosis over training, at one learning rate."""
    plt = pyplot()
    chosen = sorted((r for r in results if r.lr == lr and r.seed == min(x.seed for x in results)), key=lambda r: r.arm)
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for ax, (template, label) in zip(axes, BY_DEPTH):
        for r in chosen:
            values = r.run.by_layer(template)  # at the last step that logged it
            if values:
                ax.plot(range(1, len(values) + 1), values, marker="o", label=r.arm)
        _log_axes(ax, "block (depth)", label, f"end of training, lr {lr:g}")
    save(fig, depth_path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in chosen:
        points = over_layers(r.run, STREAM_KURTOSIS, statistics.fmean)
        if points:
            ax.plot(*zip(*points), label=r.arm)
    ylabel = "feature kurtosis of the residual stream (mean over blocks)"
    _log_axes(ax, "step", ylabel, f"outlier features (3 = none), lr {lr:g}")
    save(fig, kurtosis_path)
