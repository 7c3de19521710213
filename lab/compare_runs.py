"""Compare any training runs without wandb: plots and a summary (Markdown and JSON), grouped by a config key.

The library behind ``python -m lab compare``. Runs are grouped by a config key, by default by
every key they differ in except the seed (their variant, e.g. ``rmsnorm-peri-qk``, and, say, the
learning rate), so only seeds are pooled: curves show the mean over
a group's runs with a band of one standard deviation. The summary compares each group's final
validation metric with the baseline group's as the studies do: runs of one seed share their initial
weights and batches across groups, so the unit is the per-seed difference, through the studies' verdict
engine (``lab.stats.paired_comparison``); groups whose seeds do not pair get Welch's unpaired test,
named as such, and one run a side gets no test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lab.format import interval, number
from lab.keys import instances, metric_key
from lab.plots import pyplot, save
from lab.runs import (
    BASELINE,
    SWEPT,
    Run,
    RunsError,
    check_comparable,
    default_baseline,
    group_runs,
    latest_eval,
    loss_ceiling,
    readable_runs,
    show_report,
    swept_keys,
)
from lab.stats import Comparison, paired_by_seed, unpaired_comparison

NORM_IN_RMS = metric_key("act/{norm}/in_rms")
NORM_IN_KURTOSIS = metric_key("act/{norm}/in_kurtosis")
GAIN_MEAN = metric_key("act/{norm}/gain_mean")
GAIN_STD = metric_key("act/{norm}/gain_std")
TOKENS_PER_SEC = metric_key("perf/tokens_per_sec")
MFU = metric_key("perf/mfu")
ELAPSED = metric_key("perf/elapsed_s")
PEAK_MEM = metric_key("perf/peak_mem_gb")
NORM_TIME_FRAC = metric_key("perf/norm_time_frac")
LOSS_CURVES = (metric_key("train/loss"), metric_key("val/loss"))
BY_DEPTH = (
    (metric_key("act/layers.{i}/stream_rms"), "residual stream RMS"),
    (metric_key("act/layers.{i}/massive_ratio"), "massive-activation ratio (max |h| / median |h|)"),
    (metric_key("attn/layers.{i}/sink_mass"), "attention-sink mass (weight on position 0)"),
)


def mean_band(runs: list[Run], key: str, x_of=None) -> tuple[list[float], list[float], list[float]]:
    """x, mean and std over runs of ``key``, at the steps every run logged (and ``x_of`` can place:
    it returns None for a step it cannot, e.g. wall-clock time at an eval-only step)."""
    by_step = [dict(r.series(key)) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in by_step))) if by_step else []
    if x_of:
        steps = [step for step in steps if x_of(runs[0], step) is not None]
    means = [statistics.fmean(s[step] for s in by_step) for step in steps]
    stds = [statistics.pstdev([s[step] for s in by_step]) for step in steps]
    xs = [x_of(runs[0], step) for step in steps] if x_of else steps
    return xs, means, stds


def _tokens(run: Run, step: int) -> float:
    return step * run.config["runtime"]["global_batch_tokens"]


def plot_losses(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    ceiling = loss_ceiling([r for runs in groups.values() for r in runs])
    for row, key in enumerate(LOSS_CURVES):
        for col, (label, x_of) in enumerate((("step", None), ("tokens", _tokens), ("wall-clock s", None))):
            ax = axes[row][col]
            for name, runs in groups.items():
                if label == "wall-clock s":
                    if not all(r.series(ELAPSED) for r in runs):
                        ax.text(0.5, 0.5, f"no {ELAPSED} logged", ha="center", transform=ax.transAxes)
                        continue
                    clock = [dict(r.series(ELAPSED)) for r in runs]
                    x_of = lambda run, step, clock=clock: (  # noqa: E731
                        statistics.fmean(c[step] for c in clock) if all(step in c for c in clock) else None
                    )
                xs, means, stds = mean_band(runs, key, x_of)
                ax.plot(xs, means, label=f"{name} (n={len(runs)})")
                ax.fill_between(
                    xs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)], alpha=0.2
                )
            ax.set_xlabel(label)
            ax.set_ylabel(key)
            ax.grid(alpha=0.3)
            if ceiling is not None and ax.get_ylim()[1] > ceiling:
                ax.set_ylim(top=ceiling)  # a diverged run leaves the axis instead of flattening the rest
    axes[0][0].legend()
    save(fig, path)


def plot_throughput(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(groups)
    for ax, key, label in ((axes[0], TOKENS_PER_SEC, "tokens/s"), (axes[1], MFU, "MFU")):
        values = [[statistics.median(v for _, v in r.series(key)) for r in groups[n] if r.series(key)] for n in names]
        ax.bar(
            names,
            [statistics.fmean(v) if v else 0 for v in values],
            yerr=[statistics.pstdev(v) if len(v) > 1 else 0 for v in values],
            capsize=4,
        )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    save(fig, path)


def _norm_names(runs: list[Run]) -> list[str]:
    keys = {k for r in runs for row in r.rows for k in row}
    return sorted(instances(NORM_IN_RMS, keys, "norm"), key=_layer_order)


def _layer_order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    return (int(parts[1]), parts[2]) if parts[0] == "layers" else (10**9, name)


def plot_activations(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(groups), figsize=(5 * len(groups), 7), squeeze=False)
    for col, (name, runs) in enumerate(groups.items()):
        for row, (stat, template) in enumerate((("in_rms", NORM_IN_RMS), ("in_kurtosis", NORM_IN_KURTOSIS))):
            ax = axes[row][col]
            for norm in _norm_names(runs):
                xs, means, _ = mean_band(runs, template.format(norm=norm))
                ax.plot(xs, means, label=norm)
            ax.set_title(f"{name}: {stat.replace('in_', 'residual stream ')}")
            ax.set_xlabel("step")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        if axes[0][col].get_lines():  # runs that logged no norm statistics draw no lines
            axes[0][col].legend(fontsize=6)
    save(fig, path)


def plot_gains(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, runs in groups.items():
        norms = _norm_names(runs)
        for ax, (stat, template) in zip(axes, (("gain_mean", GAIN_MEAN), ("gain_std", GAIN_STD))):
            values = [
                statistics.fmean(v for r in runs if (v := r.last(template.format(norm=n))) is not None) for n in norms
            ]
            ax.plot(range(len(norms)), values, marker="o", label=name)
            ax.set_xticks(range(len(norms)), norms, rotation=70, fontsize=7)
            ax.set_ylabel(f"final {stat}")
            ax.grid(alpha=0.3)
    axes[0].legend()
    save(fig, path)


def plot_depth(groups: dict[str, list[Run]], path: Path) -> None:
    """Each by-layer statistic against depth at the last step that logged it, mean over a group's runs."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(BY_DEPTH), figsize=(5.5 * len(BY_DEPTH), 4.2))
    for ax, (template, label) in zip(axes, BY_DEPTH):
        for name, runs in groups.items():
            layers = [values for r in runs if (values := r.by_layer(template))]
            if layers:
                ax.plot(
                    range(1, len(layers[0]) + 1), [statistics.fmean(v) for v in zip(*layers)], marker="o", label=name
                )
        ax.set_xlabel("block (depth)")
        ax.set_ylabel(label)
        ax.set_yscale("log" if "sink" not in template else "linear")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, path)


def quant_deltas(runs: list[Run]) -> dict[str, float]:
    """Per quantization scheme, the mean loss increase over the runs that eval.py evaluated under it."""
    per_scheme: dict[str, list[float]] = {}
    for run in runs:
        for scheme, q in ((latest_eval(run) or {}).get("quant") or {}).items():
            per_scheme.setdefault(scheme, []).append(q["delta/val/loss"])
    return {scheme: statistics.fmean(values) for scheme, values in per_scheme.items()}


def _mean_of_last(runs: list[Run], key: str) -> float | None:
    values = [v for r in runs if (v := r.last(key)) is not None]
    return statistics.fmean(values) if values else None


def _median_of(runs: list[Run], key: str) -> float | None:
    values = [m for r in runs if (m := r.median(key)) is not None]
    return statistics.fmean(values) if values else None


# A two-sided comparison, read from the engine's verdict for expect="lower"
READING = {"agrees": "lower", "disagrees": "higher", "inconclusive": "no difference shown"}
# The fewest seeds (pairs, or runs on the smaller side) a reading is made from: the studies' own minimum,
# and the smallest count at which the engine's coverage is simulated (tests/unit/lab/test_stats.py)
MIN_SEEDS_TO_READ = 3

SUMMARY_NOTE = (
    "Final metric: mean ± standard deviation over each group's runs. Δ: the group minus the baseline with "
    "its 95% interval and p, compared as the studies compare: paired by seed (runs of one seed share their "
    "initial weights and batches, so the unit is the per-seed difference; Student's t on the differences, "
    "lab.stats.paired_comparison) over the seeds both groups ran; where fewer than two seeds pair, "
    "Welch's unpaired t-test, named as such; with one run on a side, no test. A reading of lower or higher "
    f"means the interval excludes 0, and is made from {MIN_SEEDS_TO_READ} seeds or more (the studies' minimum); "
    "each row is one comparison, not a corrected family."
)


@dataclass(frozen=True)
class AgainstBaseline:
    """How a group compared with the baseline: the test, in words, and what it returned (None: no test)."""

    test: str
    result: Comparison | None
    # what the test read, so it can be recomputed: the paired seeds and each side's value on them, or (Welch's)
    # every run's value on each side
    values: dict = field(default_factory=dict)


def _finals_by_seed(runs: list[Run], metric: str) -> dict[int, float] | None:
    """The final ``metric`` per seed, or None where a seed ran twice in the group (it cannot pair)."""
    by_seed = {}
    for run in runs:
        seed, value = run.config.get("seed"), run.last(metric)
        if value is None:
            continue
        if seed in by_seed:
            return None
        by_seed[seed] = value
    return by_seed


def _seed_list(seeds) -> str:
    return ", ".join(map(str, sorted(seeds)))


def against_baseline(runs: list[Run], base_runs: list[Run], metric: str) -> AgainstBaseline:
    """The group's final ``metric`` against the baseline's: paired by seed over the seeds both ran (two or
    more), else Welch's unpaired test over every run, else (one run on a side) no test."""
    mine, base = _finals_by_seed(runs, metric), _finals_by_seed(base_runs, metric)
    found = paired_by_seed(mine, base, "lower") if mine is not None and base is not None else None
    if found is not None and len(found[0]) >= 2:
        common, comparison = found
        unpaired = (mine.keys() | base.keys()) - set(common)
        test = f"paired t, seeds {_seed_list(common)}" + (
            f" (seeds {_seed_list(unpaired)} ran on one side only: left out)" if unpaired else ""
        )
        values = {"seeds": common, "group": [mine[s] for s in common], "baseline": [base[s] for s in common]}
        return AgainstBaseline(test, comparison, values)
    a = [v for r in runs if (v := r.last(metric)) is not None]
    b = [v for r in base_runs if (v := r.last(metric)) is not None]
    result = unpaired_comparison(a, b)
    if result is None:
        return AgainstBaseline("no test: one run on a side", None)
    return AgainstBaseline("Welch's t, unpaired: fewer than two seeds pair", result, {"group": a, "baseline": b})


def reading(result: Comparison | None) -> str:
    if result is None:
        return "–"
    if result.seeds < MIN_SEEDS_TO_READ:
        return f"not read: {result.seeds} seeds"
    return READING[result.verdict]


def summary_rows(groups: dict[str, list[Run]], metric: str, baseline: str | None) -> list[dict]:
    """One row per group: its runs and seeds, its final ``metric`` (mean, standard deviation), the comparison
    with the baseline (the test, Δ, interval, p and reading), its quantization deltas and its speed."""
    finals = {name: [v for r in runs if (v := r.last(metric)) is not None] for name, runs in groups.items()}
    if baseline is not None and baseline not in groups:
        raise RunsError(f"--baseline {baseline!r} is not one of the groups: {', '.join(groups)}")
    rows = []
    for name, runs in groups.items():
        values = finals[name]
        comparison = None
        if baseline is not None and name != baseline and values and finals[baseline]:
            comparison = against_baseline(runs, groups[baseline], metric)
        result = comparison.result if comparison else None
        rows.append(
            {
                "group": name,
                "runs": len(runs),
                "seeds": sorted({r.config.get("seed") for r in runs}),
                "final": {
                    "mean": statistics.fmean(values) if values else None,
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                },
                "vs_baseline": None
                if comparison is None
                else {
                    "test": comparison.test,
                    "difference": result.difference if result else None,
                    "ci95": result.ci95 if result else None,
                    "p": result.p if result else None,
                    "seeds": result.seeds if result else None,
                    "reading": reading(result),
                    "values": comparison.values,
                },
                "quant_deltas": quant_deltas(runs),
                "tokens_per_sec": _median_of(runs, TOKENS_PER_SEC),
                "mfu": _median_of(runs, MFU),
                "peak_mem_gb": _mean_of_last(runs, PEAK_MEM),
                "norm_time_frac": _mean_of_last(runs, NORM_TIME_FRAC),
            }
        )
    return rows


def summary_table(groups: dict[str, list[Run]], metric: str, baseline: str | None) -> str:
    """summary_rows as a Markdown table."""
    return rows_table(summary_rows(groups, metric, baseline), metric, baseline)


def rows_table(rows: list[dict], metric: str, baseline: str | None) -> str:
    """The Markdown table of summary_rows' rows."""
    schemes = sorted({scheme for row in rows for scheme in row["quant_deltas"]})
    lines = [
        f"| group | runs | seeds | final {metric} | Δ vs {baseline} [95% CI] | p | reading | compared by | "
        + "".join(f"Δ loss {s} | " for s in schemes)
        + "tokens/s | MFU | peak mem (GB) | time in norms |",
        "|---|---|---|---|---|---|---|---|" + "---|" * len(schemes) + "---|---|---|---|",
    ]
    for row in rows:
        versus = row["vs_baseline"] or {}
        delta = versus.get("difference")
        delta_text = "–" if delta is None else f"{number(delta, '+.4f')}{interval(versus['ci95'], '+.4f')}"
        lines.append(
            f"| {row['group']} | {row['runs']} | {_seed_list(row['seeds'])} | "
            f"{number(row['final']['mean'], '.4f')} ± {row['final']['std']:.4f} | {delta_text} | "
            f"{number(versus.get('p'), '.3g')} | {versus.get('reading', '–')} | {versus.get('test', '–')} | "
            + "".join(f"{number(row['quant_deltas'].get(s), '+.4f')} | " for s in schemes)
            + f"{number(row['tokens_per_sec'], ',.0f')} | {number(row['mfu'], '.1%')} | "
            f"{number(row['peak_mem_gb'], '.2f')} | {number(row['norm_time_frac'], '.1%')} |"
        )
    return "\n".join(lines)


def compare(inputs: list[str], out: Path, group_by: str, metric: str, baseline: str | None) -> Path:
    runs, skipped = readable_runs(inputs)
    for line in skipped:
        print(f"lab compare: left out: {line}", file=sys.stderr)
    check_comparable(runs, metric)
    groups = group_runs(runs, group_by)
    swept = ", ".join(f"`{key}`" for key in swept_keys(runs))
    grouping = f"`{group_by}`" if group_by != SWEPT else "`variant`" + (f" and {swept}" if swept else "")
    if baseline is None:
        baseline = default_baseline(groups)
    rows = summary_rows(groups, metric, baseline)  # the table's and summary.json's, computed once
    out.mkdir(parents=True, exist_ok=True)
    plot_losses(groups, out / "loss.png")
    plot_throughput(groups, out / "throughput.png")
    plot_activations(groups, out / "activations.png")
    plot_gains(groups, out / "gains.png")
    plot_depth(groups, out / "depth.png")
    runs_list = "\n".join(
        f"- `{r.path}` ({group_by}={r.lookup(group_by) if group_by != SWEPT else r.config['variant']}, "
        f"seed {r.config.get('seed')}, {r.status()}"
        f"{'; its last metrics line was cut off and is left out' if r.torn_tail else ''})"
        for r in runs
    )
    summary = (
        f"# Run comparison, grouped by {grouping}\n\n{rows_table(rows, metric, baseline)}\n\n"
        f"{SUMMARY_NOTE} "
        "Throughput, MFU and time in norms are medians over logged steps, averaged over runs. "
        "Δ loss <scheme>: the quantized minus the float loss that eval.py quant=[...] wrote in each run's "
        "eval.json, mean over the group's evaluated runs.\n\n"
        f"Plots: loss.png, throughput.png, activations.png, gains.png, depth.png\n\nRuns:\n{runs_list}\n"
        + "".join(f"- left out: {line}\n" for line in skipped)
    )
    (out / "summary.md").write_text(summary)
    data = {
        "metric": metric,
        "grouped_by": group_by,
        "baseline": baseline,
        "groups": rows,
    }
    (out / "summary.json").write_text(json.dumps(data, indent=1))
    return out / "summary.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="run directories, sweep directories or globs")
    parser.add_argument("--out", type=Path, default=Path("comparison"))
    parser.add_argument(
        "--group-by",
        default=SWEPT,
        help="a dotted config key, or swept (default): the variant and every other key the runs differ in "
        "except the seed, e.g. 'rmsnorm-qk, train.lr=0.01'",
    )
    parser.add_argument("--metric", default="val/loss", help="final metric to compare (val/loss or val/bpb)")
    parser.add_argument("--baseline", default=None, help=f"group to compare against (default: {BASELINE} if present)")


def run(args: argparse.Namespace) -> int:
    return show_report(
        "compare", lambda: compare(args.inputs, args.out, args.group_by, args.metric, args.baseline), args.out
    )
