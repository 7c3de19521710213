"""Compare training runs without wandb: plots and a Markdown summary, grouped by norm variant.

    python scripts/compare_runs.py runs/sweep-2026-11-30_10-00-00 --out comparison/
    python scripts/compare_runs.py 'runs/small-*' --group-by model.name --baseline small

Inputs are run directories, folders holding runs (a multirun sweep), or globs. Each run's
config.yaml and metrics.jsonl are read; runs are grouped by a config key (the norm variant,
e.g. ``rmsnorm-peri-qk``, by default) and seeds are pooled: curves show the mean over a group's runs with a band of one
standard deviation. The summary compares each group's final validation metric with the
baseline group's, with Welch's t-test when both have at least two runs.

Writes loss.png, throughput.png, activations.png, gains.png and summary.md into --out.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml
from plots import pyplot, save


class RunsError(ValueError):
    """Runs that cannot be compared as asked; the message says why and what to do."""


@dataclass
class Run:
    path: Path
    config: dict
    rows: list[dict]
    tokenizer_hash: str
    torn_tail: bool = False  # the last line of metrics.jsonl was cut off (a run being written, or killed mid-line)

    def lookup(self, dotted: str):
        value = self.config
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                raise RunsError(f"{self.path}/config.yaml has no key {dotted!r} to group by")
            value = value[part]
        return value

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in self.rows if isinstance(r.get(key), (int, float))]

    def last(self, key: str) -> float | None:
        points = self.series(key)
        return points[-1][1] if points else None

    def median(self, key: str) -> float | None:
        points = self.series(key)
        return statistics.median(v for _, v in points) if points else None

    def by_layer(self, key: str, step: int | None = None) -> list[float]:
        """``key`` for layers 0, 1, ... (``{}`` marks the index, e.g. ``act/layers.{}/stream_rms``), from
        the last row that logged layer 0 at or before ``step`` (default: the last such row)."""
        for row in reversed(self.rows):
            if key.format(0) in row and (step is None or row["step"] <= step):
                values = []
                while key.format(len(values)) in row:
                    values.append(row[key.format(len(values))])
                return values
        return []

    def status(self) -> str:
        """finished, diverged at step N, or the steps logged so far (still training, or stopped)."""
        step = self.rows[-1].get("step", 0)
        if any(row.get("diverged") for row in self.rows):
            return f"diverged at step {step}"
        max_steps = self.config.get("train", {}).get("max_steps")
        return "finished" if step == max_steps else f"step {step} of {max_steps} (still training, or stopped)"


def read_metrics(metrics: Path) -> tuple[list[dict], bool]:
    """The rows of a metrics.jsonl and whether its last line was cut off (and left out).

    A run being written can be read mid-line; a cut in any other line is damage, and refused.
    """
    lines = [line for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                return rows, True
            raise RunsError(f"{metrics} line {number} is not JSON: the file is damaged; move the run aside") from None
    return rows, False


def load_run(path: Path) -> Run:
    rows, torn = read_metrics(path / "metrics.jsonl")
    if not rows:
        raise RunsError(f"run {path} has no metrics (metrics.jsonl is missing or empty); did its training start?")
    tokenizer = path / "tokenizer.json"
    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest() if tokenizer.exists() else "unknown"
    config = yaml.safe_load((path / "config.yaml").read_text())
    config.setdefault("variant", config["norm"]["name"])  # runs from before placements: the norm was the variant
    return Run(path, config, rows, digest, torn)


def find_runs(inputs: list[str]) -> list[Run]:
    """Every run (config.yaml and metrics.jsonl) at or under the given paths and globs."""
    return [load_run(p) for p in find_run_dirs(inputs)]


def find_run_dirs(inputs: list[str]) -> list[Path]:
    """Every run directory (one holding config.yaml) at or under the given paths and globs."""
    found: set[Path] = set()
    for pattern in inputs:
        matches = [Path(p) for p in sorted(glob.glob(pattern))]
        if not matches:
            raise RunsError(f"{pattern!r} matches nothing")
        for path in matches:
            if (path / "config.yaml").exists():
                found.add(path)
            elif path.is_dir():
                found.update(p.parent for p in path.rglob("config.yaml") if p.parent.name != ".hydra")
    if not found:
        raise RunsError(
            f"no runs found under {', '.join(inputs)}: a run directory holds the config.yaml and "
            "metrics.jsonl that train.py writes"
        )
    return sorted(found)


def check_comparable(runs: list[Run], metric: str) -> None:
    if metric.endswith("/loss") and len({r.tokenizer_hash for r in runs}) > 1:
        raise RunsError(
            "these runs use different tokenizers, so their losses are per token of different vocabularies "
            "and do not compare. Compare bits per byte instead: --metric val/bpb"
        )


def mean_band(runs: list[Run], key: str, x_of=None) -> tuple[list[float], list[float], list[float]]:
    """x, mean and std over runs of ``key``, at the steps every run logged."""
    by_step = [dict(r.series(key)) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in by_step))) if by_step else []
    means = [statistics.fmean(s[step] for s in by_step) for step in steps]
    stds = [statistics.pstdev([s[step] for s in by_step]) for step in steps]
    xs = [x_of(runs[0], step) for step in steps] if x_of else steps
    return xs, means, stds


def welch_p_value(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value of Welch's t-test; None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    import mpmath

    var_a, var_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if var_a + var_b == 0:
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    # P(|T| > t) for Student's t with df degrees of freedom, via the regularized incomplete beta.
    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


def _tokens(run: Run, step: int) -> float:
    return step * run.config["runtime"]["global_batch_tokens"]


def plot_losses(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for row, key in enumerate(("train/loss", "val/loss")):
        for col, (label, x_of) in enumerate((("step", None), ("tokens", _tokens), ("wall-clock s", None))):
            ax = axes[row][col]
            for name, runs in groups.items():
                if label == "wall-clock s":
                    if not all(r.series("perf/elapsed_s") for r in runs):
                        ax.text(0.5, 0.5, "no perf/elapsed_s logged", ha="center", transform=ax.transAxes)
                        continue
                    clock = [dict(r.series("perf/elapsed_s")) for r in runs]
                    x_of = lambda run, step, clock=clock: statistics.fmean(c[step] for c in clock)  # noqa: E731
                xs, means, stds = mean_band(runs, key, x_of)
                ax.plot(xs, means, label=f"{name} (n={len(runs)})")
                ax.fill_between(
                    xs, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)], alpha=0.2
                )
            ax.set_xlabel(label)
            ax.set_ylabel(key)
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    save(fig, path)


def plot_throughput(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(groups)
    for ax, key, label in ((axes[0], "perf/tokens_per_sec", "tokens/s"), (axes[1], "perf/mfu", "MFU")):
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
    keys = {k for r in runs for row in r.rows for k in row if k.startswith("act/") and k.endswith("/in_rms")}
    return sorted({k[len("act/") : -len("/in_rms")] for k in keys}, key=_layer_order)


def _layer_order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    return (int(parts[1]), parts[2]) if parts[0] == "layers" else (10**9, name)


def plot_activations(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(groups), figsize=(5 * len(groups), 7), squeeze=False)
    for col, (name, runs) in enumerate(groups.items()):
        for row, stat in enumerate(("in_rms", "in_kurtosis")):
            ax = axes[row][col]
            for norm in _norm_names(runs):
                xs, means, _ = mean_band(runs, f"act/{norm}/{stat}")
                ax.plot(xs, means, label=norm)
            ax.set_title(f"{name}: {stat.replace('in_', 'residual stream ')}")
            ax.set_xlabel("step")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0][col].legend(fontsize=6)
    save(fig, path)


def plot_gains(groups: dict[str, list[Run]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, runs in groups.items():
        norms = _norm_names(runs)
        for ax, stat in zip(axes, ("gain_mean", "gain_std")):
            values = [statistics.fmean(v for r in runs if (v := r.last(f"act/{n}/{stat}")) is not None) for n in norms]
            ax.plot(range(len(norms)), values, marker="o", label=name)
            ax.set_xticks(range(len(norms)), norms, rotation=70, fontsize=7)
            ax.set_ylabel(f"final {stat}")
            ax.grid(alpha=0.3)
    axes[0].legend()
    save(fig, path)


def _mean_of_last(runs: list[Run], key: str) -> float | None:
    values = [v for r in runs if (v := r.last(key)) is not None]
    return statistics.fmean(values) if values else None


def _median_of(runs: list[Run], key: str) -> float | None:
    values = [m for r in runs if (m := r.median(key)) is not None]
    return statistics.fmean(values) if values else None


def summary_table(groups: dict[str, list[Run]], metric: str, baseline: str | None) -> str:
    finals = {name: [v for r in runs if (v := r.last(metric)) is not None] for name, runs in groups.items()}
    if baseline is not None and baseline not in groups:
        raise RunsError(f"--baseline {baseline!r} is not one of the groups: {', '.join(groups)}")
    base = finals.get(baseline, [])
    lines = [
        f"| group | runs | final {metric} | Δ vs {baseline} | Welch p | tokens/s | MFU | peak mem (GB) | time in norms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v, spec: "–" if v is None else format(v, spec)  # noqa: E731
    for name, runs in groups.items():
        values = finals[name]
        mean = statistics.fmean(values) if values else None
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        delta = p = None
        if base and values and name != baseline:
            delta = mean - statistics.fmean(base)
            p = welch_p_value(values, base)
        p_text = "–" if p is None else f"{p:.3g}{' (significant at 0.05)' if p < 0.05 else ''}"
        norm_frac = _mean_of_last(runs, "perf/norm_time_frac")
        lines.append(
            f"| {name} | {len(runs)} | {fmt(mean, '.4f')} ± {std:.4f} | {fmt(delta, '+.4f')} | {p_text} | "
            f"{fmt(_median_of(runs, 'perf/tokens_per_sec'), ',.0f')} | {fmt(_median_of(runs, 'perf/mfu'), '.1%')} | "
            f"{fmt(_mean_of_last(runs, 'perf/peak_mem_gb'), '.2f')} | {fmt(norm_frac, '.1%')} |"
        )
    return "\n".join(lines)


def compare(inputs: list[str], out: Path, group_by: str, metric: str, baseline: str | None) -> Path:
    runs = find_runs(inputs)
    check_comparable(runs, metric)
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[str(run.lookup(group_by))].append(run)
    groups = dict(sorted(groups.items()))
    if baseline is None:
        baseline = "rmsnorm" if "rmsnorm" in groups else next(iter(groups))
    out.mkdir(parents=True, exist_ok=True)
    plot_losses(groups, out / "loss.png")
    plot_throughput(groups, out / "throughput.png")
    plot_activations(groups, out / "activations.png")
    plot_gains(groups, out / "gains.png")
    runs_list = "\n".join(
        f"- `{r.path}` ({group_by}={r.lookup(group_by)}, seed {r.config.get('seed')}, {r.status()}"
        f"{'; its last metrics line was cut off and is left out' if r.torn_tail else ''})"
        for r in runs
    )
    summary = (
        f"# Run comparison, grouped by `{group_by}`\n\n{summary_table(groups, metric, baseline)}\n\n"
        f"Final {metric}: mean ± standard deviation over each group's runs (seeds pooled). "
        "Throughput, MFU and time in norms are medians over logged steps, averaged over runs.\n\n"
        f"Plots: loss.png, throughput.png, activations.png, gains.png\n\nRuns:\n{runs_list}\n"
    )
    (out / "summary.md").write_text(summary)
    return out / "summary.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="run directories, sweep directories or globs")
    parser.add_argument("--out", type=Path, default=Path("comparison"))
    parser.add_argument(
        "--group-by", default="variant", help="a dotted config key (default: variant, e.g. rmsnorm-peri-qk)"
    )
    parser.add_argument("--metric", default="val/loss", help="final metric to compare (val/loss or val/bpb)")
    parser.add_argument("--baseline", default=None, help="group to compare against (default: rmsnorm if present)")
    args = parser.parse_args(argv)
    try:
        summary = compare(args.inputs, args.out, args.group_by, args.metric, args.baseline)
    except RunsError as err:
        print(f"compare_runs: {err}", file=sys.stderr)
        return 1
    print(summary.read_text())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
