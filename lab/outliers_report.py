"""What each norm choice costs under quantization, against its outlier features and massive activations.

    python train.py -m +experiment=outliers
    python eval.py 'checkpoint=runs/outliers/*' quant=[w8a8,w8a8_tensor,w4a16,fp8]
    python -m lab outliers runs/outliers --out docs/outliers

For each run it reads the last checkpoint's entry in the run's eval.json (eval.py's float loss,
its probes and the quantized losses) and writes into --out:

- quant_vs_outliers.png: each scheme's loss increase against the outlier-feature kurtosis and
  against the massive-activation ratio, one point per run (marker = seed);
- depth.png: the massive-activation ratio and the attention-sink mass against depth, per variant;
- report.md and outliers.json: per variant the mean of each quantity with a Student's t 95% interval
  over seeds, each variant's w8a8_tensor cost against the baseline's paired by seed, the rank
  correlation of kurtosis with that cost over variants (seeds averaged) with its p-value, and what
  the data supports.

Kurtosis is He et al.'s (arXiv 2405.19279): of the residual stream's per-feature RMS, the largest
over blocks (the block whose inputs are hardest to quantize). The massive-activation ratio is Sun
et al.'s (arXiv 2402.17762): the largest |h| over the median |h| of the stream leaving a block,
again the largest over blocks.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from lab.format import interval, number, write_report_files
from lab.keys import metric_key
from lab.labels import as_arms
from lab.plots import pyplot, save
from lab.runs import BASELINE, Run, RunsError, latest_eval, layer_values, load_runs, show_report
from lab.stats import holm, paired_by_seed, rank_correlation, t_interval
from lab.study import TRAINED_MARGIN
from lab.unigram import run_unigram_loss

KURTOSIS = metric_key("act/layers.{i}/stream_feature_kurtosis")
MASSIVE = metric_key("act/layers.{i}/massive_ratio")
SINK = metric_key("attn/layers.{i}/sink_mass")
MASSIVE_AT = (metric_key("act/layers.{i}/massive_position"), metric_key("act/layers.{i}/massive_feature"))
SCHEMES = ("w8a8", "w8a8_tensor", "w4a16", "fp8")
PER_TENSOR = "w8a8_tensor"  # where a few outlier features coarsen every feature's grid
POSITIVE_CONTROL = "prmsnorm"
EVAL_COMMAND = "python eval.py 'checkpoint=<runs>/*' quant=[w8a8,w8a8_tensor,w4a16,fp8]"
# Why a model imported by scripts/import_hf.py is no point of the report: its losses are per token of another
# tokenizer, after another training; eval.py shows its outliers by themselves
IMPORTED = (
    "imported, not trained from scratch here: the report compares norm choices trained alike; "
    "eval.py prints an imported model's outliers block by block"
)


@dataclass
class Point:
    """One run, evaluated: float loss, outlier statistics, and the loss increase under each scheme."""

    run: Run
    arm: str
    seed: int
    loss: float
    kurtosis: float
    massive_ratio: float
    sink_mass: float
    deltas: dict[str, float]
    by_layer: dict[str, list[float]]
    pinned: bool  # the largest activation sits at one (position, feature) in every block

    @property
    def lr(self) -> float:
        return float(self.run.config["train"]["lr"])

    @property
    def trained(self) -> bool:
        """At least TRAINED_MARGIN below the unigram loss of its validation windows (as the study judges it)."""
        unigram = run_unigram_loss(self.run)
        return unigram is None or self.loss < unigram - TRAINED_MARGIN


def _last_eval(run: Run) -> dict | None:
    newest = latest_eval(run)
    return newest if newest and "quant" in newest else None


def load_points(inputs: list[str]) -> tuple[list[Point], list[str]]:
    runs, skipped = load_runs(inputs)
    if runs and all(run.imported_from for run in runs):
        raise RunsError(f"every run under {', '.join(inputs)} was {IMPORTED}")
    points = []
    for run in runs:
        if run.imported_from:
            skipped.append(f"{run.path}: {IMPORTED}")
            continue
        result = _last_eval(run)
        if result is None:
            skipped.append(f"{run.path}: no quantized evaluation on its own data in eval.json; run {EVAL_COMMAND}")
            continue
        layers = {
            name: layer_values(result, key)
            for name, key in (("kurtosis", KURTOSIS), ("massive", MASSIVE), ("sink", SINK))
        }
        points.append(
            Point(
                run,
                run.config["variant"],
                run.config["seed"],
                result["val/loss"],
                max(layers["kurtosis"]),
                max(layers["massive"]),
                statistics.fmean(layers["sink"]),
                {scheme: result["quant"][scheme]["delta/val/loss"] for scheme in SCHEMES if scheme in result["quant"]},
                layers,
                len(set(zip(*(layer_values(result, key) for key in MASSIVE_AT)))) == 1,
            )
        )
    if not points:
        raise RunsError(f"no run under {', '.join(inputs)} has a quantized evaluation; run {EVAL_COMMAND}")
    for p, arm in zip(points, as_arms([p.arm for p in points])):
        p.arm = arm
    return points, skipped


def _by_arm(points: list[Point]) -> dict[str, list[Point]]:
    grouped: dict[str, list[Point]] = {}
    for p in sorted(points, key=lambda p: (p.arm, p.seed)):
        grouped.setdefault(p.arm, []).append(p)
    return grouped


def _summary(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "ci95": t_interval(values), "n": len(values)}


def paired_cost(points: list[Point], arm: str, baseline: str, scheme: str) -> dict | None:
    """``variant``'s loss increase under ``scheme`` minus the baseline's, paired by seed."""
    return paired_difference(points, arm, baseline, lambda p: p.deltas.get(scheme))


def paired_difference(points: list[Point], arm: str, baseline: str, value) -> dict | None:
    """``value(point)`` of ``variant`` minus the baseline's, paired by seed: mean, 95% interval, p."""
    grouped = _by_arm(points)
    if arm not in grouped or baseline not in grouped:
        return None
    mine, base = ({p.seed: value(p) for p in grouped[v]} for v in (arm, baseline))
    found = paired_by_seed(mine, base, "higher")
    if found is None:
        return None
    seeds, comparison = found
    return {"difference": comparison.difference, "ci95": comparison.ci95, "p": comparison.p, "seeds": len(seeds)}


def setup(points: list[Point]) -> dict:
    """What every run shares, from its config: the model, its size, the budget, and the line "trained" uses."""
    config = points[0].run.config
    return {
        "model": config["model"]["name"],
        "params": config["runtime"].get("params"),
        "max_steps": config["train"]["max_steps"],
        "batch_size": config["train"]["batch_size"],
        "seq_len": config["model"]["max_seq_len"],
        "optimizer": config["train"].get("optimizer", "adamw"),
        "seeds": sorted({p.seed for p in points}),
        "unigram_loss": run_unigram_loss(points[0].run),
        "trained_margin": TRAINED_MARGIN,
    }


def summarize(points: list[Point], baseline: str) -> dict:
    arms = {}
    for arm, runs in _by_arm(points).items():
        arms[arm] = {
            "loss": _summary([p.loss for p in runs]),
            "kurtosis": _summary([p.kurtosis for p in runs]),
            "massive_ratio": _summary([p.massive_ratio for p in runs]),
            "sink_mass": _summary([p.sink_mass for p in runs]),
            "pinned_massive_activation": sum(p.pinned for p in runs),
            "trained": all(p.trained for p in runs),
            "delta": {s: _summary([p.deltas[s] for p in runs if s in p.deltas]) for s in SCHEMES},
            "vs_baseline": paired_cost(points, arm, baseline, PER_TENSOR) if arm != baseline else None,
            "kurtosis_vs_baseline": paired_difference(points, arm, baseline, lambda p: p.kurtosis)
            if arm != baseline
            else None,
        }
    # One point per variant (its seeds averaged): the variant is the unit that varies, its seeds are not
    # independent points. An untrained model's outliers say nothing.
    counted = [v for v in arms.values() if v["trained"] and v["delta"][PER_TENSOR]["n"]]
    cost = [v["delta"][PER_TENSOR]["mean"] for v in counted]
    correlation = {
        name: dict(zip(("rho", "p"), found))
        if (found := rank_correlation([v[name]["mean"] for v in counted], cost))
        else None
        for name in ("kurtosis", "massive_ratio")
    }
    tested = [c for c in correlation.values() if c is not None]  # the two correlations are one family
    for c, adjusted in zip(tested, holm([c["p"] for c in tested])):
        c["p_holm"] = adjusted
    return {
        "baseline": baseline,
        "setup": setup(points),
        "learning_rates": sorted({p.lr for p in points}),
        # the positive control's premise: its outlier features are heavier than the baseline's
        "control_kurtosis": (arms.get(POSITIVE_CONTROL) or {}).get("kurtosis_vs_baseline"),
        "variants": arms,
        "rank_correlation": {**{f"{k}_vs_{PER_TENSOR}": v for k, v in correlation.items()}, "variants": len(counted)},
    }


def plot_quant_vs_outliers(points: list[Point], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, len(SCHEMES), figsize=(4.2 * len(SCHEMES), 7.5), squeeze=False)
    colors = {v: f"C{i}" for i, v in enumerate(_by_arm(points))}
    markers = "os^Dvx"
    for row, (attr, label) in enumerate(
        (
            ("kurtosis", "feature kurtosis (max over blocks)"),
            ("massive_ratio", "massive-activation ratio (max over blocks)"),
        )
    ):
        for col, scheme in enumerate(SCHEMES):
            ax = axes[row][col]
            for p in points:
                if scheme in p.deltas:
                    ax.scatter(
                        getattr(p, attr),
                        p.deltas[scheme],
                        color=colors[p.arm],
                        marker=markers[p.seed % len(markers)],
                        label=p.arm if p.seed == min(q.seed for q in points) else None,
                    )
            ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel(f"{scheme}: loss increase (nats)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Loss increase under each scheme, one point per run (marker = seed)")
    save(fig, path)


def plot_depth(points: list[Point], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for arm, runs in _by_arm(points).items():
        for ax, key in zip(axes, ("massive", "sink")):
            per_layer = [statistics.fmean(values) for values in zip(*(p.by_layer[key] for p in runs))]
            ax.plot(range(1, len(per_layer) + 1), per_layer, marker="o", label=arm)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("massive-activation ratio: max |h| / median |h|")
    axes[1].set_ylabel("attention-sink mass: mean weight on position 0")
    for ax in axes:
        ax.set_xlabel("block (depth)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("Leaving each block, mean over seeds")
    save(fig, path)


def _mean_and_interval(entry: dict, spec: str = ".3g") -> str:
    return number(entry["mean"], spec) + interval(entry.get("ci95"), spec)


def conclusions(summary: dict) -> list[str]:
    """What the data supports, from the intervals (never from the means alone)."""
    arms, baseline = summary["variants"], summary["baseline"]
    lines = []
    untrained = [v for v, e in arms.items() if not e["trained"]]
    lrs = summary["learning_rates"]
    lines.append(
        f"Every run trained at lr {', '.join(f'{lr:g}' for lr in lrs)}, not at each variant's own best rate: the "
        "costs below are of untuned variants, and a variant's rate is a confound of its cost."
    )
    control = arms.get(POSITIVE_CONTROL, {}).get("vs_baseline")
    premise = summary.get("control_kurtosis")
    if premise and premise["ci95"] and not premise["ci95"][0] > 0:
        lines.append(
            f"The positive control's premise does not hold here: {POSITIVE_CONTROL}'s kurtosis minus {baseline}'s is "
            f"{premise['difference']:+.3g}{interval(premise['ci95'], '+.3g')} (p = {number(premise['p'])}), not "
            "shown to be higher, so its cost below does not test the outlier link."
        )
    if control and not {POSITIVE_CONTROL, baseline} & set(untrained):
        ci = control["ci95"]
        k_control, k_base = arms[POSITIVE_CONTROL]["kurtosis"]["mean"], arms[baseline]["kurtosis"]["mean"]
        shown = (
            "costs more"
            if ci and ci[0] > 0
            else "costs less"
            if ci and ci[1] < 0
            else "is not shown to cost more or less"
        )
        lines.append(
            f"{POSITIVE_CONTROL}, meant as the positive control (kurtosis {k_control:.3g} against {baseline}'s "
            f"{k_base:.3g}), {shown} under {PER_TENSOR} than {baseline}: {control['difference']:+.4f} nats"
            + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}], p = {number(control['p'])}," if ci else "")
            + f" paired over {control['seeds']} seeds."
        )
    if untrained:
        lines.append(
            f"{', '.join(untrained)} did not train (loss not {TRAINED_MARGIN} nats below the unigram loss "
            f"{number(summary['setup']['unigram_loss'], '.3f')}), so "
            "its outlier statistics and quantization costs are left out of every statement below."
        )
    for arm, entry in arms.items():
        cost = entry["vs_baseline"]
        if arm in (baseline, POSITIVE_CONTROL, *untrained) or not cost or not cost["ci95"]:
            continue
        low, high = cost["ci95"]
        if low > 0 or high < 0:
            word = "more" if low > 0 else "less"
            lines.append(
                f"{arm} costs {word} under {PER_TENSOR} than {baseline}: {cost['difference']:+.4f} [{low:+.4f}, "
                f"{high:+.4f}], p = {number(cost['p'])} (two-sided, paired over {cost['seeds']} seeds)."
            )
    pinned = [
        f"{v} ({e['pinned_massive_activation']} of {e['loss']['n']})"
        for v, e in arms.items()
        if e["pinned_massive_activation"]
    ]
    if pinned:
        lines.append(
            "Runs whose largest activation sits at one (position, feature) in every block, a massive activation "
            f"carried down the residual stream (Sun et al. 2024): {', '.join(pinned)}."
        )
    rho = summary["rank_correlation"]
    kurt, massive = rho["kurtosis_vs_" + PER_TENSOR], rho["massive_ratio_vs_" + PER_TENSOR]
    if kurt is None or massive is None:
        lines.append(
            f"Too few variants that trained ({rho['variants']}) for a rank correlation with the {PER_TENSOR} cost."
        )
    else:
        lines.append(
            f"Over the {rho['variants']} variants that trained (each its seeds' mean), Spearman's rho with the "
            f"{PER_TENSOR} loss increase is {kurt['rho']:+.2f} (exact permutation p = {kurt['p']:.2g}) for kurtosis "
            f"and {massive['rho']:+.2f} (p = {massive['p']:.2g}) for the massive-activation ratio; over so few "
            "variants, at one rate, a correlation is suggestive only."
        )
    return lines


def write_report(inputs: list[str], out: Path, baseline: str = BASELINE) -> Path:
    points, skipped = load_points(inputs)
    if baseline not in {p.arm for p in points}:
        raise RunsError(
            f"the baseline {baseline!r} is not among the variants: {', '.join(sorted({p.arm for p in points}))}"
        )
    summary = summarize(points, baseline)
    out.mkdir(parents=True, exist_ok=True)
    plot_quant_vs_outliers(points, out / "quant_vs_outliers.png")
    plot_depth(points, out / "depth.png")
    table = [
        "| variant | seeds | val/loss (float) | kurtosis | massive ratio | sink mass | "
        + " | ".join(f"Δ {s}" for s in SCHEMES)
        + f" | Δ {PER_TENSOR} − {baseline}'s, paired |",
        "|---|---|---|---|---|---|" + "---|" * len(SCHEMES) + "---|",
    ]
    for arm, v in summary["variants"].items():
        paired = v["vs_baseline"]
        paired_cell = (
            "–"
            if not paired
            else f"{paired['difference']:+.4f}"
            + (f" [{paired['ci95'][0]:+.4f}, {paired['ci95'][1]:+.4f}]" if paired["ci95"] else "")
        )
        table.append(
            f"| {arm}{'' if v['trained'] else ' (did not train)'} | {v['loss']['n']} | {_mean_and_interval(v['loss'], '.3f')} | {_mean_and_interval(v['kurtosis'])} | {_mean_and_interval(v['massive_ratio'])} | "
            f"{_mean_and_interval(v['sink_mass'], '.2f')} | "
            + " | ".join(_mean_and_interval(v["delta"][s], "+.4f") for s in SCHEMES)
            + f" | {paired_cell} |"
        )
    report = f"""# Outlier features, massive activations and quantization, by norm choice

{len(points)} runs ({len({p.arm for p in points})} variants x {len(summary["setup"]["seeds"])} seeds), each evaluated in float and under
{", ".join(SCHEMES)} (model/quantize.py: the blocks' linear layers fake-quantized; embeddings and head in float).
Δ: quantized minus float validation loss (nats). Means over seeds with Student's t 95% intervals.

{chr(10).join(table)}

Kurtosis: of the residual stream's per-feature RMS, the largest over blocks (3 for Gaussian features;
He et al. 2024, arXiv 2405.19279). Massive ratio: the largest |h| over the median |h| leaving a block,
largest over blocks (Sun et al. 2024, arXiv 2402.17762). Sink mass: the mean attention weight that queries
give position 0, mean over blocks.

![loss increase against outlier statistics](quant_vs_outliers.png)

![massive activations and attention sinks against depth](depth.png)

## What the data supports

{chr(10).join("- " + line for line in conclusions(summary))}
"""
    runs = [
        {"variant": p.arm, "seed": p.seed, "loss": p.loss, "kurtosis": p.kurtosis, "massive_ratio": p.massive_ratio,
         "sink_mass": p.sink_mass, "delta": p.deltas}
        for p in points
    ]  # fmt: skip
    return write_report_files(out, report, skipped, "outliers.json", {**summary, "runs": runs})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="the experiment's run folder (runs/outliers), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("outliers"))
    parser.add_argument("--baseline", default=BASELINE)


def run(args: argparse.Namespace) -> int:
    return show_report("outliers", lambda: write_report(args.inputs, args.out, args.baseline), args.out)
