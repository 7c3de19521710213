"""A study run at several models (depths, widths): each model a study of its own, the claims at every model.

    python -m lab study +experiment=stability_depth --out docs/study/depth     # trains it, then writes this
    python -m lab across-models runs/stability_depth --out docs/study/depth

Each model is a learning-rate study of its own (lab/study.py), its variants' entries those of the one-model
report (lab/study_report.py): the best rate its selection seeds chose, the held-out loss its report seeds
give there, its LR sensitivity over the common grid. Beside them, per block at the best rate (report seeds'
mean), the skip deltas (``eval.py layer_importance=true``), the angular distances (the layer-importance
probe) and the residual stream's RMS, where the runs logged them. The spec's claims are evaluated at every
model by the one rule (lab/claims.py), one family under Holm, so a finding "as the model grows" reads as
the verdicts from the smallest model to the largest, each with its interval.

The models are ordered and drawn along the study's axis (``plan.axis`` in configs/study/<name>.yaml,
recorded in the study's folder; ``--axis`` here): one of the model sizes in ``AXES``.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from lab.claims import claims_of, evaluate_claim, with_holm
from lab.format import interval, number, write_report_files
from lab.plots import error_bars, pyplot, save
from lab.results import Result, by_model, load_results, planned_grid, read_plan
from lab.runs import BASELINE, RunsError, show_report
from lab.study import ANGULAR_DISTANCE, STREAM_RMS, Study, skip_deltas
from lab.study_plan import AXES
from lab.study_report import arm_json
from lab.unigram import run_unigram_loss


def model_sizes(config: dict) -> dict:
    """A model's sizes, as a run records them: its depth, its width, its parameters, and those outside the
    embeddings and the LM head."""
    params, model = config["runtime"].get("params"), config["model"]
    tables = config["runtime"]["vocab_size"] * model["d_model"] * (1 if model["tie_embeddings"] else 2)
    return {
        "n_layers": model["n_layers"],
        "d_model": model["d_model"],
        "params": params,
        "non_embedding_params": None if params is None else params - tables,
    }


def axis_words(axis: str, value: int) -> str:
    """One model's place on the axis: ``16 layers``, ``738,432 non-embedding parameters``."""
    return f"{value:,} {AXES[axis]}"


def _layer_means(per_run: list[list[float]]) -> list[float] | None:
    """The per-block mean over runs, where every run has the same number of blocks."""
    if not per_run or len({len(values) for values in per_run}) != 1 or not per_run[0]:
        return None
    return [statistics.fmean(block) for block in zip(*per_run)]


def layer_profile(study: Study, arm: str) -> dict:
    """Per block, at the arm's best rate (its report seeds' mean): what the block contributes, and the residual
    stream's RMS after it at the end of training (the scale itself, where stream_growth gives the last block's
    over the first's)."""
    summary = study.summaries[arm]
    at_best = [study.cells[(arm, summary.best_lr, s)] for s in summary.report_seeds]
    return {
        "layer_importance": {
            "skip_delta": _layer_means([d for r in at_best if (d := skip_deltas(r.run))]),
            "angular_distance": _layer_means([a for r in at_best if (a := r.run.by_layer(ANGULAR_DISTANCE))]),
        },
        "stream_rms": _layer_means([rms for r in at_best if (rms := r.run.by_layer(STREAM_RMS))]),
    }


def by_model_along(results: list[Result], baseline: str, inputs: list[str], axis: str) -> tuple[list[dict], list]:
    """Per model, in the axis's order: its sizes and every arm's entry; and the claims evaluated at every model,
    each with its model and its place on the axis. A claim whose arms ran at no model is another study's (a spec
    that extends one keeps its claims) and is left out; the rest are one family."""
    rows, claims = [], []
    for name, model_results in by_model(results).items():
        study = Study(model_results, baseline, planned_grid(inputs))
        sizes = model_sizes(study.config(baseline))  # the baseline's: QK-norm adds its gains
        arms = {arm: {**arm_json(study, arm), **layer_profile(study, arm)} for arm in study.summaries}
        rows.append({"model": name, **sizes, "variants": arms})
        claims += [{"model": name, axis: sizes[axis], **evaluate_claim(c, study)} for c in claims_of(results, inputs)]
    values = [row[axis] for row in rows]
    if len(set(values)) != len(values):
        raise RunsError(f"these runs have several models at one {axis} ({values}); a study across models has one each")
    order = {row["model"]: row[axis] for row in rows}
    ran = {c["claim"] for c in claims if c["arm"] is not None}
    claims = sorted((c for c in claims if c["claim"] in ran), key=lambda c: order[c["model"]])
    with_holm(claims)  # the study's tested claims, at every model: one family
    return sorted(rows, key=lambda row: row[axis]), claims


def plot_against_axis(rows: list[dict], axis: str, path: Path, unigram: float | None) -> None:
    """Each arm's held-out loss at its best rate (left) and its LR sensitivity (right) against the axis."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    arms = list(dict.fromkeys(arm for row in rows for arm in row["variants"]))
    panels = (("best_loss", "mean", "held-out loss at its best rate (nats/token)"),
              ("lr_sensitivity", "value", "LR sensitivity (nats)"))  # fmt: skip
    for ax, (key, value, label) in zip(axes, panels):
        for i, arm in enumerate(arms):
            entries = [(row[axis], row["variants"][arm][key]) for row in rows if arm in row["variants"]]
            shown = [(x, e) for x, e in entries if e[value] is not None]
            ys = [e[value] for _, e in shown]
            errors = error_bars(ys, [e["ci95"] for _, e in shown])
            xs = [x for x, _ in shown]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=4, label=arm, color=plt.get_cmap("tab10")(i % 10))
        if key == "best_loss" and unigram is not None:
            ax.axhline(unigram, color="grey", linestyle=":", label="unigram loss")
        ax.set_xscale("log", base=2 if axis == "n_layers" else 10)
        if axis == "n_layers":
            ax.set_xticks([row[axis] for row in rows], [str(row[axis]) for row in rows])
        ax.set_xlabel(AXES[axis])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title("bars: 95% interval over report seeds")
    axes[1].set_title("bars: 95% interval over selection seeds")
    axes[0].legend(fontsize=7)
    save(fig, path)


def plot_layer_importance(rows: list[dict], axis: str, path: Path) -> None:
    """Skip delta (top) and angular distance (bottom) against the block, one column per model."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(rows), figsize=(5 * len(rows), 7), squeeze=False)
    for col, row in enumerate(rows):
        for line, (key, label) in enumerate((("skip_delta", "skip delta (nats)"), ("angular_distance", "angular distance"))):  # fmt: skip
            ax = axes[line][col]
            for i, (arm, entry) in enumerate(row["variants"].items()):
                values = entry["layer_importance"][key]
                if values:
                    ax.plot(range(1, len(values) + 1), values, marker=".", label=arm, color=plt.get_cmap("tab10")(i))
            ax.set_title(f"{row['model']} ({axis_words(axis, row[axis])})")
            ax.set_xlabel("block")
            ax.set_ylabel(label)
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.grid(alpha=0.3)
    # the legend goes on the panel that plots the most arms (a panel without values has none to show)
    fullest = max(axes.flat, key=lambda ax: len(ax.get_legend_handles_labels()[1]))
    fullest.legend(fontsize=7)
    save(fig, path)


def _arm_cell(entry: dict | None) -> str:
    if entry is None:
        return "–"
    flags = ("" if entry["trained"] else ", did not train") + (
        "" if entry["best_lr_inside"] else ", best rate at an edge"
    )
    loss, sensitivity = entry["best_loss"], entry["lr_sensitivity"]
    return (
        f"{entry['best_lr']:g}, {number(loss['mean'], '.3f')}{interval(loss['ci95'])}, "
        f"{number(sensitivity['value'], '.3f')}{interval(sensitivity['ci95'])}{flags}"
    )


def _claim_cell(c: dict | None) -> str:
    if c is None:
        return "–"
    if c["verdict"] == "not tested":
        return f"not tested: {c['reason']}"
    difference = f"{c['difference']:+.3f}{interval(c.get('ci95'), '+.3f')}" if "difference" in c else "–"
    return f"{difference}, p = {number(c.get('p'))} (Holm {number(c.get('p_holm'))}): **{c['verdict']}**"


def write_report(inputs: list[str], out: Path, metric: str, baseline: str, axis: str | None = None) -> Path:
    axis = axis or ((read_plan(inputs) or {}).get("plan") or {}).get("axis")
    if axis not in AXES:
        raise RunsError(
            f"the axis {axis!r} is not one of {', '.join(AXES)}: name it with --axis, or plan.axis in the spec"
        )
    results, skipped = load_results(inputs, metric)
    if len(by_model(results)) < 2:
        raise RunsError("these runs are of one model; a study across models needs runs of two or more")
    rows, claims = by_model_along(results, baseline, inputs, axis)
    unigram = next((u for r in results if (u := run_unigram_loss(r.run)) is not None), None)
    out.mkdir(parents=True, exist_ok=True)
    plot_against_axis(rows, axis, out / f"against_{axis}.png", unigram)
    arms = list(dict.fromkeys(arm for row in rows for arm in row["variants"]))
    where = [f"{row['model']} ({axis_words(axis, row[axis])})" for row in rows]
    table = [
        "| variant | "
        + " | ".join(f"{w}: best lr, held-out loss [95% CI], LR sensitivity [95% CI]" for w in where)
        + " |",
        "|---|" + "---|" * len(rows),
        *(f"| {arm} | " + " | ".join(_arm_cell(row["variants"].get(arm)) for row in rows) + " |" for arm in arms),
    ]
    claim_table = ["| claim | source | " + " | ".join(where) + " |", "|---|---|" + "---|" * len(rows)]
    for name in dict.fromkeys(c["claim"] for c in claims):
        at = {c["model"]: c for c in claims if c["claim"] == name}
        first = next(iter(at.values()))
        cells = [_claim_cell(at.get(row["model"])) for row in rows]
        versus = f"{first['arm']} − {first['against'] or '0'}"
        claim_table.append(
            f"| {name} ({first['statistic']}: {versus}) | {first['source']} | " + " | ".join(cells) + " |"
        )
    with_layers = any(e["layer_importance"][k] for row in rows for e in row["variants"].values() for k in ("skip_delta", "angular_distance"))  # fmt: skip
    if with_layers:
        plot_layer_importance(rows, axis, out / "layer_importance.png")
    layers = """
## What each block contributes

Per block, at each variant's best rate, the mean over its report seeds of the skip delta (the
validation loss with the block replaced by the identity, minus the plain loss: `eval.py
layer_importance=true`) and of the angular distance between the block's input and output (the
layer-importance probe at the end of training; 0: the block leaves the stream's direction alone).

![skip delta and angular distance against the block, one column per model](layer_importance.png)
"""
    title = (read_plan(inputs) or {}).get("title") or f"A study across models, by {AXES[axis]}"
    report = f"""# {title}

{len(results)} runs: {len(rows)} models ({", ".join(where)}) x {len(arms)} variants, metric `{metric}`. Every
variant at its own best rate per model, chosen on its selection seeds; the loss there comes from report seeds
that did not choose it, on held-out windows, with Student's t interval over those seeds. LR sensitivity
(Wortsman et al. 2023, Sec. 3.1): the mean of each selection seed's own value over the common grid, with
Student's t interval over those seeds. A variant trained when its best loss is 0.3 nats below the unigram
loss{f" ({unigram:.3f})" if unigram is not None else ""}.

![held-out loss and LR sensitivity against {AXES[axis]}](against_{axis}.png)

{chr(10).join(table)}
{layers if with_layers else ""}
## The claims at each model

Each cell is the claim evaluated at that model by the one rule (lab/claims.py): "not tested" where an arm
is missing, did not train (unless the claim is that it fails to), has its best rate at an edge, or lies
outside the models the paper's finding is about (its `regime`); otherwise the per-seed paired difference
(arm − against, or the arm's own value against 0), Student's t interval and p, Holm's adjusted p over the
claims at every model, and the verdict they agree on. A verdict holds at its model's scale: a difference that
does not show at these models is "not seen up to {axis_words(axis, rows[-1][axis])}", not evidence against
the paper.

{chr(10).join(claim_table)}
"""
    data = {
        "metric": metric,
        "learning_rates": planned_grid(inputs) or sorted({r.lr for r in results}),
        "axis": axis,
        "by_model": rows,
        "claims": claims,
    }
    return write_report_files(out, report, skipped, "study.json", data)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability_depth), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study/across_models"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument(
        "--axis", choices=list(AXES), help="the models' axis (default: plan.axis in the study's folder)"
    )


def run(args: argparse.Namespace) -> int:
    return show_report(
        "across-models", lambda: write_report(args.inputs, args.out, args.metric, args.baseline, args.axis), args.out
    )
