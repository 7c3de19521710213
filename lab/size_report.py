"""LR sensitivity against model size: Wortsman et al.'s signature figure (arXiv 2309.14322, Fig. 1).

    python scripts/run_study.py +experiment=stability_size
    python scripts/size_report.py runs/stability --out docs/study/size

Each model in the runs is a study of its own (lab/study.py) over the variants every model
ran; the report plots each variant's LR sensitivity, with its 95% interval over seeds, against
the model's parameter count, and evaluates the study spec's claims at each size. Far below the
paper's sizes, a difference that does not show is "not seen below N parameters", not "absent".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.claims import claims_of, evaluate_claim, with_holm
from lab.format import interval, number
from lab.plots import error_bars, pyplot, save
from lab.results import Result, by_model, load_results, planned_grid
from lab.runs import BASELINE, RunsError, report_command
from lab.stats import t_interval
from lab.study import STATISTICS, Study, per_seed

SENSITIVITY, BEST_LOSS = STATISTICS["lr_sensitivity"], STATISTICS["best_loss"]


def _sizes(run_config: dict) -> tuple[int, int]:
    """(all parameters, parameters outside the embeddings and the LM head)."""
    params, model = run_config["runtime"]["params"], run_config["model"]
    tables = run_config["runtime"]["vocab_size"] * model["d_model"] * (1 if model["tie_embeddings"] else 2)
    return params, params - tables


def by_size(results: list[Result], baseline: str, inputs: list[str]) -> list[dict]:
    """Per model, smallest first: its size and each shared variant's LR sensitivity and best loss."""
    models = by_model(results)
    shared = set.intersection(*({r.arm for r in rs} for rs in models.values()))
    if baseline not in shared:
        raise RunsError(f"the baseline {baseline!r} is not run at every model size ({', '.join(models)})")
    rows = []
    for name, model_results in models.items():
        study = Study([r for r in model_results if r.arm in shared], baseline, planned_grid(inputs))
        base_config = next(r.run.config for r in model_results if r.arm == baseline)
        params, non_embedding = _sizes(base_config)  # the baseline's: QK-norm adds its gains
        arms = {}
        for arm in sorted(shared):
            summary = study.summaries[arm]
            sensitivities = per_seed(study, SENSITIVITY, arm, summary.selection_seeds)
            best = per_seed(study, BEST_LOSS, arm, summary.report_seeds)
            arms[arm] = {
                "lr_sensitivity": {
                    "value": sum(sensitivities) / len(sensitivities) if sensitivities else None,
                    "ci95": t_interval(sensitivities),
                },
                "best_lr": summary.best_lr,
                "best_loss": sum(best) / len(best) if best else None,
                "selection_seeds": summary.selection_seeds,
                "report_seeds": summary.report_seeds,
            }
        claims = [evaluate_claim(claim, study) for claim in claims_of(model_results, inputs)]
        rows.append(
            {
                "model": name,
                "d_model": base_config["model"]["d_model"],
                "params": params,
                "non_embedding_params": non_embedding,
                "variants": arms,
                "claims": [c for c in claims if c["arm"] and c["against"]],
            }
        )
    with_holm([c for row in rows for c in row["claims"]])  # the study's tested claims, at every size: one family
    return sorted(rows, key=lambda row: row["params"])


def plot_sensitivity_vs_size(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in rows[0]["variants"]:
        xs = [row["non_embedding_params"] for row in rows]
        values = [row["variants"][arm]["lr_sensitivity"] for row in rows]
        ys = [v["value"] for v in values]
        ax.errorbar(xs, ys, yerr=error_bars(ys, [v["ci95"] for v in values]), marker="o", capsize=4, label=arm)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("LR sensitivity (nats)")
    ax.set_title("LR sensitivity against model size (bars: 95% interval over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def write_size_report(inputs: list[str], out: Path, metric: str, baseline: str) -> Path:
    results, skipped = load_results(inputs, metric)
    if len(by_model(results)) < 2:
        raise RunsError("these runs are of one model; a size comparison needs runs of two or more")
    grid = planned_grid(inputs)
    rows = by_size(results, baseline, inputs)
    out.mkdir(parents=True, exist_ok=True)
    plot_sensitivity_vs_size(rows, out / "lr_sensitivity_vs_size.png")
    arms = list(rows[0]["variants"])
    table = [
        "| model | d_model | params (non-embedding) | "
        + " | ".join(f"{v}: LR sensitivity [95% CI] | {v}: best lr, held-out loss" for v in arms)
        + " |",
        "|---|---|---|" + "---|---|" * len(arms),
    ]
    for row in rows:
        cells = []
        for v in arms:
            entry = row["variants"][v]
            sens = entry["lr_sensitivity"]
            cells += [
                f"{number(sens['value'], '.3f')}{interval(sens['ci95'])}",
                f"{entry['best_lr']:g}, {number(entry['best_loss'], '.3f')}",
            ]
        table.append(
            f"| {row['model']} | {row['d_model']} | {row['params']:,} ({row['non_embedding_params']:,}) | "
            + " | ".join(cells)
            + " |"
        )
    claim_lines = [
        f"- {row['model']}: {c['claim']}: {c['arm']} − {c['against']} = "
        + (f"{c['difference']:+.3f}{interval(c.get('ci95'))}" if "difference" in c else "–")
        + f" over {len(c.get('seeds', []))} seeds (p = {number(c.get('p'))}, Holm {number(c.get('p_holm'))}): **{c['verdict']}**"
        + (f" ({c['reason']})" if c.get("reason") else "")
        for row in rows
        for c in row["claims"]
        if c["statistic"] == "lr_sensitivity"
    ]
    smallest, largest = rows[0]["non_embedding_params"], rows[-1]["non_embedding_params"]
    report = f"""# LR sensitivity against model size

{sum(r.arm in arms for r in results)} runs: {len(rows)} models ({", ".join(r["model"] for r in rows)}) x {len(arms)} variants
({", ".join(arms)}), each over the same learning-rate grid and seeds, metric `{metric}`.

![LR sensitivity against model size](lr_sensitivity_vs_size.png)

{chr(10).join(table)}

LR sensitivity as in the main report (Wortsman et al. 2023, Sec. 3.1): the mean of each selection
seed's own value, with Student's t interval over seeds; best loss from the report seeds. These models have {smallest:,} to {largest:,} non-embedding
parameters, far below the paper's smallest: a difference that does not show here is "not seen below
{largest:,} parameters", not evidence against the paper.

## The claims at each size

{chr(10).join(claim_lines) or "No LR-sensitivity claim has both of its arms at every size."}
"""
    if skipped:
        report += "\n## Skipped\n\n" + "\n".join(f"- {message}" for message in skipped) + "\n"
    (out / "report.md").write_text(report)
    data = {"metric": metric, "learning_rates": grid or sorted({r.lr for r in results}), "by_size": rows}
    (out / "study.json").write_text(json.dumps(data, indent=1))
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study/size"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    return report_command(
        "size_report", lambda: write_size_report(args.inputs, args.out, args.metric, args.baseline), args.out
    )
