"""A learning-rate study's report: which norm variants train well over which rates, and what its claims show.

The library behind ``scripts/study_report.py`` (its statistics: analysis/study.py; its claims:
analysis/claims.py; its figures: analysis/study_figures.py):

    python train.py -m +experiment=stability
    python scripts/study_report.py runs/stability --out study/ --speed bench_out/variants/results.json

In the style of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") and Peri-LN (Kim et al. 2025). Reads every run under the inputs (runs missing
metrics are named and skipped) and writes into --out:

- loss_vs_lr.png: final validation loss and bits per byte against learning rate, one curve per
  variant, diverged runs marked at the initial loss;
- report.md: per variant the best learning rate and loss (mean ± std over seeds, Welch's p
  against the baseline from two seeds up), the LR sensitivity, divergences, the speed table when
  --speed names a scripts/bench_variants.py result, and the claims the experiment config
  declares (analysis/claims.py), each with its statistic, interval and verdict;
- attention_logits.png: the largest attention logit against step, at the highest learning rate
  the baseline survives and the next one up;
- depth.png: the residual stream's RMS, the massive-activation ratio and the attention-sink mass
  against depth at the end of training;
- feature_kurtosis.png: the outlier-feature kurtosis of the residual stream over training.

LR sensitivity (Wortsman et al., Sec. 3.1): the mean over the learning-rate grid of
``min(final loss, initial loss) - best loss``, where a diverged run counts as the initial loss
and the initial loss is that of the untrained model, ln(vocabulary size).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from analysis.claims import claims_of, evaluate_claim
from analysis.format import interval, number
from analysis.labels import shared_switches
from analysis.results import HELDOUT_LOSS, by_model, load_results, planned_grid
from analysis.runs import BASELINE, RunsError
from analysis.stats import bootstrap_ci
from analysis.study import (
    TRAINED_MARGIN,
    UNTRAINED_GAP,
    Study,
    against_baseline,
    explanation,
    heldout_best_loss,
    seed_interval,
)
from analysis.study_figures import plot_attention_logits, plot_depth_and_kurtosis, plot_loss_vs_lr


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


def study_json(study: Study, metric: str, evaluated: list[dict]) -> dict:
    """The study's machine-readable results (study.json)."""
    variants = {}
    for name, summary in study.summaries.items():
        best, best_key = heldout_best_loss(study, name)
        variants[name] = {
            "best_lr": summary.best_lr,
            "rates": summary.rates,
            "best_lr_inside": study.best_inside(name),
            "grid_seeds": summary.grid_seeds,
            "best_loss": {
                "mean": statistics.fmean(best) if best else None,
                "ci95": bootstrap_ci(best) if len(best) > 1 else None,
                "seeds": len(best),
                "measured_on": best_key,
            },
            "lr_sensitivity": {
                "value": summary.sensitivity,
                "ci95": seed_interval(study, Study.lr_sensitivity, name),
            },
            "trained": name not in study.untrained,
            "explanation": explanation(study, name),
        }
    return {
        "metric": metric,
        "initial_loss": study.results[0].initial_loss,
        "unigram_loss": study.unigram_loss,
        "learning_rates": study.grid,
        "cells": [
            {"variant": r.variant, "lr": r.lr, "seed": r.seed, "loss": r.final, "diverged": r.diverged_at is not None}
            for r in sorted(study.results, key=lambda r: (r.variant, r.lr, r.seed))
        ],
        "variants": variants,
        "claims": [{**c, "ci95": list(c["ci95"]) if c.get("ci95") else None} for c in evaluated],
    }


def claims_table(evaluated: list[dict]) -> str:
    if not evaluated:
        return "These runs' experiment config declares no claims (`claims:` in configs/experiment/)."
    lines = [
        "| claim | source | statistic | arm vs against | arm − against [95% CI] | paired p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in evaluated:
        ci = f" [{c['ci95'][0]:+.3g}, {c['ci95'][1]:+.3g}]" if c.get("ci95") else ""
        numbers = (
            f"{number(c['value_arm'])} vs {number(c['value_against'])}" if "value_arm" in c else "–",
            f"{c['difference']:+.3g}{ci}" if "difference" in c else "–",
        )
        why = f" ({c['why']})" if c.get("why") else ""
        lines.append(
            f"| {c['claim']} (expect {c['expect']}) | {c['source']} | {c['statistic']} | {c['arm']} vs {c['against']}: "
            f"{numbers[0]} | {numbers[1]} | {number(c.get('p'))} | **{c['verdict']}**{why} |"
        )
    return "\n".join(lines)


def observations(study: Study) -> list[str]:
    """What the numbers show for every variant, before any claim."""
    summaries, baseline = study.summaries, study.baseline
    base = summaries[baseline]
    ranked = sorted(summaries.values(), key=lambda s: s.sensitivity)
    lines = [
        "LR sensitivity over the common grid, lowest first: "
        + ", ".join(
            f"{s.variant} {s.sensitivity:.3f}" + (" (did not train)" if s.variant in study.untrained else "")
            for s in ranked
        )
        + f". The baseline ({baseline}) reaches its best at lr {base.best_lr:g}."
    ]
    if study.untrained:
        rule = (
            f"not {TRAINED_MARGIN} nats below the unigram loss of the validation windows ({study.unigram_loss:.3f})"
            if study.unigram_loss is not None
            else f"more than {UNTRAINED_GAP} nats above {baseline}'s"
        )
        lines.append(
            f"{', '.join(sorted(study.untrained))}: best loss {rule} at every learning rate, so they did not train "
            "in this budget; their low LR sensitivity means equally poor at every rate, not stable."
        )
    edge = [s.variant for s in summaries.values() if not s.rates[0] < s.best_lr < s.rates[-1]]
    if edge:
        lines.append(
            f"Best rate at an edge of the rates run even after the extra rates: {', '.join(edge)}; "
            "their best loss is an upper bound."
        )
    for s in summaries.values():
        if s.variant == baseline:
            continue
        c = against_baseline(study, s.variant)
        if c["difference"] is None:
            continue
        evidence = f"paired p = {c['p']:.3g}" if c["p"] is not None else "one seed: no interval"
        diverged = ", ".join(f"{lr:g}" for lr in s.diverged) or "none"
        lines.append(
            f"{s.variant}: held-out best loss {c['difference']:+.3f}{interval(c['ci95'], '+.3f')} against {baseline} "
            f"over {c['seeds']} paired seeds ({evidence}); diverged at lr {diverged}."
        )
    return lines


def write_report(
    inputs: list[str], out: Path, metric: str, speed: Path | None, baseline: str, model: str | None = None
) -> Path:
    results, skipped = load_results(inputs, metric)
    models = by_model(results)
    chosen = model or max(models, key=lambda name: len(models[name]))
    if chosen not in models:
        raise RunsError(f"no runs of model {chosen!r} here; the models are: {', '.join(models)}")
    results = models[chosen]
    others = {name: len(rs) for name, rs in models.items() if name != chosen}
    study = Study(results, baseline, planned_grid(inputs))
    summaries, lrs, seeds = study.summaries, study.lrs, study.seeds
    evaluated = [evaluate_claim(claim, study) for claim in claims_of(results, inputs)]
    out.mkdir(parents=True, exist_ok=True)
    plot_loss_vs_lr(results, out / "loss_vs_lr.png")
    survived, above = study.survived_lr, study.lr_above
    plot_attention_logits(results, [lr for lr in (survived, above) if lr is not None], out / "attention_logits.png")
    base = summaries[baseline]
    plot_depth_and_kurtosis(results, base.best_lr, out / "depth.png", out / "feature_kurtosis.png")

    table = [
        f"| variant | best lr (rates run) | held-out loss at best lr [95% CI] (seeds) | Δ vs {baseline}, paired [95% CI] "
        "| LR sensitivity [95% CI] | trained | diverged at lr | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(lrs),
    ]
    data = study_json(study, metric, evaluated)
    variants_json = data["variants"]
    for s in summaries.values():
        v = variants_json[s.variant]
        best, sens = v["best_loss"], v["lr_sensitivity"]
        c = against_baseline(study, s.variant) if s.variant != baseline else None
        delta = "–" if not c or c["difference"] is None else f"{c['difference']:+.3f}{interval(c['ci95'], '+.3f')}"
        rates = f"{s.rates[0]:g}–{s.rates[-1]:g}" + ("" if v["best_lr_inside"] else ", at an edge")
        cells = [f"{s.losses_by_lr[lr]:.3f}" if lr in s.losses_by_lr else "" for lr in lrs]
        table.append(
            f"| {s.variant} | {s.best_lr:g} ({rates}) | {best['mean']:.3f}{interval(best['ci95'])} ({best['seeds']}) | "
            f"{delta} | {sens['value']:.3f}{interval(sens['ci95'])} | {'yes' if v['trained'] else '**no**'} | "
            f"{', '.join(f'{lr:g}' for lr in s.diverged) or '–'} | " + " | ".join(cells) + " |"
        )
    logit_note = (
        f"at lr {survived:g} (the highest the baseline survives)"
        + (f" and {above:g} (the next one up)" if above else " (it survives every rate, so there is none above)")
        if survived
        else "(the baseline diverged at every rate)"
    )
    unigram_line = (
        f"unigram loss of the validation windows {study.unigram_loss:.3f} (a variant trained when its best is "
        f"{TRAINED_MARGIN} nats below it: {study.unigram_loss - TRAINED_MARGIN:.3f})"
        if study.unigram_loss is not None
        else "no unigram loss recorded"
    )
    shared = shared_switches([r.run.config["variant"] for r in results])
    recipe = f" Every variant's label also has `{'-'.join(shared)}`, left out below." if shared else ""
    report = f"""# Stability study: norm variants across learning rates

{len(results)} runs of {len(summaries)} variants. The common grid: {len(study.grid)} learning rates
({", ".join(f"{lr:g}" for lr in study.grid)}); further rates where a variant's best sat at an edge; seeds
{", ".join(map(str, seeds))}, paired across variants (a seed fixes the data order and, where shapes agree, the initial weights).
Metric `{metric}` on the selection windows, initial loss ln(vocabulary) = {results[0].initial_loss:.3f},
{unigram_line}.{recipe}

![final loss against learning rate](loss_vs_lr.png)

{chr(10).join(table)}

Each variant's best rate is chosen on `{metric}` (the selection windows) over the seeds it ran at every
rate; its loss there is reported on the held-out windows (`{HELDOUT_LOSS}`, disjoint from the selection
windows), with a 95% bootstrap interval over seeds. Δ: held-out best loss minus the baseline's, paired by
seed. Per-rate columns: {metric} capped at the initial loss (a diverged run counts as the initial loss),
mean over seeds. LR sensitivity (Wortsman et al. 2023, Sec. 3.1): mean over the common grid of (capped
loss − the best of them), on the grid seeds; the interval resamples those seeds.

## What the numbers show

{chr(10).join("- " + line for line in observations(study))}

## Claims

Each claim as the experiment config declares it (arms chosen by config fields), evaluated on
these runs: the arm's statistic against the other's, their difference paired by seed with a
95% bootstrap interval over seeds and a paired t-test, and the verdict the interval supports.

{claims_table(evaluated)}

## Attention logits

The largest pre-softmax attention logit (max over layers) against step, {logit_note}:

![attention logits](attention_logits.png)

## The residual stream, massive activations and attention sinks with depth, and outlier features

At lr {base.best_lr:g} (the baseline's best), end of training:

![stream RMS, massive activations and attention sinks against depth](depth.png)

![feature kurtosis over training](feature_kurtosis.png)

## Training speed

{speed_table(speed, list(summaries))}
"""
    if others:
        report += (
            f"\nThis report is of model {chosen}; these folders also hold "
            + ", ".join(f"{n} runs of {name}" for name, n in others.items())
            + " (`scripts/size_report.py` compares the models, `--model` reports on another).\n"
        )
    if skipped:
        report += "\n## Skipped\n\n" + "\n".join(f"- {message}" for message in skipped) + "\n"
    (out / "report.md").write_text(report)
    (out / "study.json").write_text(json.dumps(data, indent=1))
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A learning-rate study's report: norm variants across learning rates, and its claims."
    )
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--speed", type=Path, default=None, help="a results.json from scripts/bench_variants.py")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--model", default=None, help="the model to report on (default: the one with the most runs)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.inputs, args.out, args.metric, args.speed, args.baseline, args.model)
    except RunsError as err:
        print(f"study_report: {err}", file=sys.stderr)
        return 1
    print(path.read_text())
    print(f"wrote {args.out}")
    return 0
