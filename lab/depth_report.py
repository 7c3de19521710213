"""The depth study's report: what each placement and depth fix does as a stack gets deep.

    python scripts/run_study.py +experiment=stability_depth --out docs/study/depth
    python scripts/depth_report.py runs/stability_depth --out docs/study/depth

Each depth (one model per depth, one width) is a learning-rate study of its own (lab/study.py):
every variant at its own best rate per depth, chosen on its selection seeds, its loss reported by
report seeds that did not choose it; per block, their skip deltas (``eval.py layer_importance=true``)
and angular distances (the layer-importance probe), averaged over the report seeds. The spec's claims
are evaluated at every depth by the one rule (lab/claims.py), so a finding "as depth grows"
reads as the verdicts from the shallowest to the deepest stack, each with its interval.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lab.claims import claims_of, evaluate_claim, with_holm
from lab.format import interval, number
from lab.plots import error_bars, pyplot, save
from lab.results import Result, by_model, load_results, planned_grid
from lab.runs import BASELINE, RunsError, report_command
from lab.stats import t_interval
from lab.study import ANGULAR_DISTANCE, STATISTICS, STREAM_RMS, Study, per_seed, skip_deltas
from lab.unigram import run_unigram_loss

BEST_LOSS = STATISTICS["best_loss"]


def _layer_means(per_run: list[list[float]]) -> list[float] | None:
    """The per-block mean over runs, where every run has the same number of blocks."""
    if not per_run or len({len(values) for values in per_run}) != 1 or not per_run[0]:
        return None
    return [statistics.fmean(block) for block in zip(*per_run)]


def arm_entry(study: Study, arm: str) -> dict:
    """One variant at one depth: its rates and best rate, whether it trained, its held-out best loss over the
    report seeds with Student's t interval, and its blocks' importance and stream RMS at that rate (report
    seeds' mean)."""
    summary = study.summaries[arm]
    losses = per_seed(study, BEST_LOSS, arm, summary.report_seeds)
    at_best = [study.cells[(arm, summary.best_lr, s)] for s in summary.report_seeds]
    return {
        "rates": summary.rates,
        "best_lr": summary.best_lr,
        "best_lr_inside": study.best_inside(arm),
        "trained": arm not in study.untrained,
        "selection_seeds": summary.selection_seeds,
        "report_seeds": summary.report_seeds,
        "best_loss": {
            "mean": statistics.fmean(losses) if losses else None,
            "ci95": t_interval(losses),
            "seeds": len(losses),
        },
        "layer_importance": {
            "skip_delta": _layer_means([d for r in at_best if (d := skip_deltas(r.run))]),
            "angular_distance": _layer_means([a for r in at_best if (a := r.run.by_layer(ANGULAR_DISTANCE))]),
        },
        # the residual stream's RMS after each block at the end of training (report seeds' mean): the scale
        # itself, where the stream_growth statistics give the last block's over the first's
        "stream_rms": _layer_means([rms for r in at_best if (rms := r.run.by_layer(STREAM_RMS))]),
    }


def by_depth(results: list[Result], baseline: str, inputs: list[str]) -> list[dict]:
    """Per depth, shallowest first: the model, its size, every variant's entry, and the claims evaluated there."""
    rows = []
    claims = claims_of(results, inputs)
    for name, model_results in by_model(results).items():
        study = Study(model_results, baseline, planned_grid(inputs))
        config = study.config(baseline)
        evaluated = [{"n_layers": config["model"]["n_layers"], **evaluate_claim(c, study)} for c in claims]
        rows.append(
            {
                "n_layers": config["model"]["n_layers"],
                "model": name,
                "d_model": config["model"]["d_model"],
                "params": config["runtime"].get("params"),
                "variants": {v: arm_entry(study, v) for v in study.summaries},
                "claims": evaluated,
            }
        )
    with_holm([c for row in rows for c in row["claims"]])  # the study's tested claims, at every depth: one family
    depths = [row["n_layers"] for row in rows]
    if len(set(depths)) != len(depths):
        raise RunsError(f"these runs have several models of one depth ({depths}); a depth study has one per depth")
    return sorted(rows, key=lambda row: row["n_layers"])


def plot_loss_vs_depth(rows: list[dict], path: Path, unigram: float | None) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, arm in enumerate(rows[0]["variants"]):
        # the depths at which the variant has a reported loss (report seeds at its best rate)
        reported = [
            row for row in rows if row["variants"].get(arm, {}).get("best_loss", {}).get("mean") is not None
        ]
        depths = [row["n_layers"] for row in reported]
        losses = [row["variants"][arm]["best_loss"] for row in reported]
        ys = [loss["mean"] for loss in losses]
        errors = error_bars(ys, [loss["ci95"] for loss in losses])
        ax.errorbar(depths, ys, yerr=errors, marker="o", capsize=4, label=arm, color=plt.get_cmap("tab10")(i))
    if unigram is not None:
        ax.axhline(unigram, color="grey", linestyle=":", label="unigram loss")
    ax.set_xscale("log", base=2)
    ax.set_xticks([row["n_layers"] for row in rows], [str(row["n_layers"]) for row in rows])
    ax.set_xlabel("layers")
    ax.set_ylabel("held-out loss at its best rate (nats/token)")
    ax.set_title("best loss against depth (bars: 95% interval over report seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, path)


def plot_layer_importance(rows: list[dict], path: Path) -> None:
    """Skip delta (top) and angular distance (bottom) against the block, one column per depth."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(rows), figsize=(5 * len(rows), 7), squeeze=False)
    for col, row in enumerate(rows):
        for line, (key, label) in enumerate(
            (("skip_delta", "skip delta (nats)"), ("angular_distance", "angular distance"))
        ):
            ax = axes[line][col]
            for i, (arm, entry) in enumerate(row["variants"].items()):
                values = entry["layer_importance"][key]
                if values:
                    ax.plot(
                        range(1, len(values) + 1), values, marker=".", label=arm, color=plt.get_cmap("tab10")(i)
                    )
            ax.set_title(f"{row['n_layers']} layers")
            ax.set_xlabel("block")
            ax.set_ylabel(label)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
    # the legend goes on the panel that plots the most variants (a panel without values has none to show)
    fullest = max(axes.flat, key=lambda ax: len(ax.get_legend_handles_labels()[1]))
    fullest.legend(fontsize=7)
    save(fig, path)


def _claim_cell(c: dict) -> str:
    if c["verdict"] == "not tested":
        return f"not tested: {c['reason']}"
    difference = f"{c['difference']:+.3f}{interval(c.get('ci95'), '+.3f')}" if "difference" in c else "–"
    return f"{difference}, p = {number(c.get('p'))} (Holm {number(c.get('p_holm'))}): **{c['verdict']}**"


def write_depth_report(inputs: list[str], out: Path, metric: str, baseline: str) -> Path:
    results, skipped = load_results(inputs, metric)
    rows = by_depth(results, baseline, inputs)
    if len(rows) < 2:
        raise RunsError("these runs are of one depth; a depth study needs models of two or more depths")
    unigram = next((u for r in results if (u := run_unigram_loss(r.run)) is not None), None)
    out.mkdir(parents=True, exist_ok=True)
    plot_loss_vs_depth(rows, out / "loss_vs_depth.png", unigram)
    plot_layer_importance(rows, out / "layer_importance.png")
    arms = list(rows[0]["variants"])
    header = "| variant | " + " | ".join(f"{row['n_layers']} layers: best lr, held-out loss [95% CI]" for row in rows)
    table = [header + " |", "|---|" + "---|" * len(rows)]
    for v in arms:
        cells = []
        for row in rows:
            e = row["variants"].get(v)
            if e is None:
                cells.append("–")
                continue
            flags = ("" if e["trained"] else ", did not train") + (
                "" if e["best_lr_inside"] else ", best rate at an edge"
            )
            loss = e["best_loss"]
            cells.append(f"{e['best_lr']:g}, {number(loss['mean'], '.3f')}{interval(loss['ci95'])}{flags}")
        table.append(f"| {v} | " + " | ".join(cells) + " |")
    claim_table = ["| claim | source | " + " | ".join(f"{row['n_layers']} layers" for row in rows) + " |"]
    claim_table.append("|---|---|" + "---|" * len(rows))
    for i, claim in enumerate(rows[0]["claims"]):
        cells = [_claim_cell(row["claims"][i]) for row in rows]
        against = claim["against"] or "0"
        claim_table.append(
            f"| {claim['claim']} ({claim['statistic']}: {claim['arm']} − {against}) | {claim['source']} | "
            + " | ".join(cells)
            + " |"
        )
    report = f"""# Depth study

{len(results)} runs: {len(rows)} depths ({", ".join(str(r["n_layers"]) for r in rows)} layers, width {rows[0]["d_model"]}) x
{len(arms)} variants, metric `{metric}`. Every variant at its own best rate per depth, chosen on its
selection seeds; the loss there comes from report seeds that did not choose it, on held-out windows,
with Student's t interval over those seeds. A variant trained when its best loss is 0.3 nats below
the unigram loss{f" ({unigram:.3f})" if unigram is not None else ""}.

![held-out loss against depth](loss_vs_depth.png)

{chr(10).join(table)}

## What each block contributes

Per block, at each variant's best rate, the mean over its report seeds of the skip delta (the
validation loss with the block replaced by the identity, minus the plain loss: `eval.py
layer_importance=true`) and of the angular distance between the block's input and output (the
layer-importance probe at the end of training; 0: the block leaves the stream's direction alone).

![skip delta and angular distance against the block, one column per depth](layer_importance.png)

## The claims at each depth

Each cell is the claim evaluated at that depth by the one rule (lab/claims.py): "not tested" where
an arm is missing, did not train (unless the claim is that it fails to), has its best rate at an edge,
or lies outside the depth the paper's finding is about (its `regime`); otherwise the per-seed paired
difference (arm − against, or the arm's own value against 0), Student's t interval and p, and the
verdict they agree on.

{chr(10).join(claim_table)}
"""
    if skipped:
        report += "\n## Skipped\n\n" + "\n".join(f"- {message}" for message in skipped) + "\n"
    (out / "report.md").write_text(report)
    data = {
        "metric": metric,
        "learning_rates": planned_grid(inputs) or sorted({r.lr for r in results}),
        "by_depth": [{k: v for k, v in row.items() if k != "claims"} for row in rows],
        "claims": [c for row in rows for c in row["claims"]],
    }
    (out / "study.json").write_text(json.dumps(data, indent=1))
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability_depth), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study/depth"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    return report_command(
        "depth_report", lambda: write_depth_report(args.inputs, args.out, args.metric, args.baseline), args.out
    )
