"""A learning-rate study's report: which norm variants train well over which rates, and what its claims show.

Its statistics: lab/study.py; its claims: lab/claims.py; its figures: lab/study_figures.py.

    python -m lab study +experiment=stability      # trains the study, then writes this report
    python -m lab report runs/stability --out study/ --speed bench_out/variants/results.json

In the style of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") and Peri-LN (Kim et al. 2025). Reads every run under the inputs (runs missing
metrics are named and skipped) and writes into --out:

- loss_vs_lr.png: final validation loss and bits per byte against learning rate, one curve per
  variant, diverged runs marked at the initial loss; loss_vs_step.png: each at its best rate;
- report.md and study.json: per variant its rates, the best rate its selection seeds chose, the
  held-out loss its report seeds give there (paired against the baseline's), its LR sensitivity,
  divergences; the speed table when --speed names a scripts/bench_variants.py result; and the claims
  of the study's spec (lab/claims.py), each with its statistic, interval, p-value and verdict.
  Every sentence of report.md is written from a number in study.json;
- attention_logits.png: the largest attention logit against step, at the highest learning rate
  at which the baseline trained and the next one up;
- depth.png: the residual stream's RMS, the massive-activation ratio and the attention-sink mass
  against depth at the end of training;
- feature_kurtosis.png: the outlier-feature kurtosis of the residual stream over training.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.claims import claims_of, equivalence_words, evaluate_claim, influence_words, with_holm
from lab.format import interval, number, write_report_files
from lab.labels import shared_switches
from lab.results import HELDOUT_LOSS, by_model, heldout_loss, load_results, planned_grid, read_plan
from lab.runs import BASELINE, RunsError, show_report
from lab.stats import paired_by_seed, t_interval
from lab.study import (
    MIN_COMMON_RATES,
    STATISTICS,
    TRAINED_MARGIN,
    UNTRAINED_GAP,
    Study,
    explanation,
    final_max_attn_logit,
    per_seed,
    seeds_for,
)
from lab.study_figures import plot_attention_logits, plot_depth_and_kurtosis, plot_loss_vs_lr, plot_loss_vs_step
from lab.study_spec import StudySpec

SENSITIVITY, BEST_LOSS = STATISTICS["lr_sensitivity"], STATISTICS["best_loss"]


def speed_table(path: Path | None, arms: list[str]) -> str:
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
        if row["variant"] in arms:
            lines.append(
                f"| {row['variant']} | {row['tokens_per_sec']:,.0f} | {row['ratio']:.3f} | "
                f"{row['ratio_min']:.3f} – {row['ratio_max']:.3f} |"
            )
    return "\n".join(lines)


def against_baseline(study: Study, arm: str) -> dict:
    """The variant's held-out best loss minus the baseline's, each at its own best rate, paired by the
    report seeds both have: the mean difference, its 95% interval and the paired p-value."""
    seeds = seeds_for(study, BEST_LOSS, arm, study.baseline)
    mine, base = ({s: study.best_loss(v, [s]) for s in seeds} for v in (arm, study.baseline))
    found = paired_by_seed(mine, base, "lower")
    if found is None:
        return {"difference": None, "ci95": None, "p": None, "seeds": []}
    seeds, comparison = found
    return {"difference": comparison.difference, "ci95": comparison.ci95, "p": comparison.p, "seeds": seeds}


def arm_json(study: Study, name: str) -> dict:
    summary = study.summaries[name]
    report = summary.report_seeds
    best = per_seed(study, BEST_LOSS, name, report)
    compared = len(study.grid) >= MIN_COMMON_RATES
    sensitivities = per_seed(study, SENSITIVITY, name, summary.selection_seeds) if compared else []
    return {
        "params": study.config(name)["runtime"].get("params"),
        "rates": summary.rates,
        "best_lr": summary.best_lr,
        "best_lr_inside": study.best_inside(name),
        "selection_seeds": summary.selection_seeds,
        "report_seeds": report,
        "selection_loss_by_lr": {f"{lr:g}": loss for lr, loss in summary.losses_by_lr.items()},
        "best_loss": {
            "mean": sum(best) / len(best) if best else None,
            "ci95": t_interval(best),
            "seeds": len(best),
            "measured_on": "heldout/loss of the report seeds" if best else "no report seeds yet",
        },
        "against_baseline": against_baseline(study, name) if name != study.baseline else None,
        "lr_sensitivity": {
            "value": sum(sensitivities) / len(sensitivities) if sensitivities else None,
            "ci95": t_interval(sensitivities),
            "seeds": len(sensitivities),
        },
        "trained": name not in study.untrained,
        # each report seed's largest attention logit at the end, at the best rate: a stalled run shows here
        "max_attn_logit_by_report_seed": {
            str(r.seed): final_max_attn_logit(r)
            for r in study.results
            if r.arm == name and r.lr == summary.best_lr and r.seed in report
        },
        "diverged_at_lr": summary.diverged,
        "symptoms": explanation(study, name),
    }


def seed_summary(data: dict) -> str:
    """The seed sets, once each: ``selection 0-4, report 5-9 (12 variants); selection 0-2, report 5-9 (3)``."""
    groups: dict[str, int] = {}
    for v in data["variants"].values():
        key = f"selection {seed_range(v['selection_seeds'])}, report {seed_range(v['report_seeds'])}"
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{key} ({n} variant{'s' if n > 1 else ''})" for key, n in groups.items())


def seed_range(seeds: list[int]) -> str:
    if not seeds:
        return "none"
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def study_scale(study: Study) -> dict:
    """The scale every verdict of the study holds at, from the baseline's run record: its parameters, steps,
    sequence length, the tokens it trained on and their number per parameter."""
    config = study.config(study.baseline)
    runtime, train = config.get("runtime", {}), config.get("train", {})
    params, steps, step_tokens = runtime.get("params"), train.get("max_steps"), runtime.get("global_batch_tokens")
    tokens = steps * step_tokens if steps and step_tokens else None
    return {
        "params": params,
        "steps": steps,
        "seq_len": train.get("seq_len") or config.get("model", {}).get("max_seq_len"),
        "tokens": tokens,
        "tokens_per_param": tokens / params if tokens and params else None,
    }


def scale_words(scale: dict) -> str:
    if None in scale.values():
        return "not recorded in full by its runs (" + ", ".join(f"{k} {number(v)}" for k, v in scale.items()) + ")"
    return (
        f"{scale['params'] / 1e6:.2f}M parameters, {scale['steps']:,} steps of {scale['seq_len']}-token sequences, "
        f"{scale['tokens'] / 1e6:.1f}M tokens ({scale['tokens_per_param']:.1f} per parameter)"
    )


def study_json(study: Study, metric: str, evaluated: list[dict]) -> dict:
    """The study's machine-readable results (study.json): every number the report states; every claim carries the
    study's scale."""
    scale = study_scale(study)

    def claim_scale(claim: dict) -> dict:
        """The study's scale, with the parameters of the claim's own arms (a variant adds or removes some)."""
        arms = {"params_arm": claim.get("arm"), "params_against": claim.get("against")}
        return {**scale, **{k: study.config(v)["runtime"].get("params") for k, v in arms.items() if v is not None}}

    return {
        "metric": metric,
        "scale": scale,
        "initial_loss": study.results[0].initial_loss,
        "unigram_loss": study.unigram_loss,
        "trained_line": None if study.unigram_loss is None else study.unigram_loss - TRAINED_MARGIN,
        "learning_rates": study.grid,
        "baseline": study.baseline,
        "reference_lr": study.reference_lr,
        "cells": [
            {
                "variant": r.arm,
                "lr": r.lr,
                "seed": r.seed,
                "loss": r.final,
                "heldout_loss": heldout_loss(r),
                "steps": r.run.rows[-1]["step"] if r.run.rows else 0,
                "diverged": r.diverged_at is not None,
            }
            for r in sorted(study.results, key=lambda r: (r.arm, r.lr, r.seed))
        ],
        "variants": {name: arm_json(study, name) for name in study.summaries},
        "claims": [
            {**c, "ci95": list(c["ci95"]) if c.get("ci95") else None, "scale": claim_scale(c)} for c in evaluated
        ],
    }


def expectation(claim: dict) -> str:
    """What a claim expects, with its margin where it has one: ``not_worse than +0.05``, ``similar within ±0.05``."""
    if claim["expect"] == "not_worse":
        return f"not worse than +{claim['margin']:g}"
    return claim["expect"] + (f" within ±{claim['margin']:g}" if claim["expect"] == "similar" else "")


def logit_table(data: dict) -> str:
    """Each variant's report seeds' final largest attention logit, a row per variant, a column per seed."""
    seeds = sorted({int(s) for v in data["variants"].values() for s in v["max_attn_logit_by_report_seed"]})
    if not seeds:
        return "No report seed has run yet."
    lines = ["| variant | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for name, v in data["variants"].items():
        by_seed = v["max_attn_logit_by_report_seed"]
        lines.append(f"| {name} | " + " | ".join(number(by_seed.get(str(s)), ".1f") for s in seeds) + " |")
    return "\n".join(lines)


def arm_scale_words(claim: dict) -> str:
    """The claim's own arms' size where it differs from the study's (a variant that adds parameters trains on
    fewer tokens per parameter), so that no verdict reads as holding at a scale its arms were not. A norm's
    own gains and biases, under 1% of the model, leave the scale as it is."""
    scale = claim["scale"]
    sizes = [scale.get(f"params_{side}") for side in ("arm", "against")]
    if scale["params"] is None or all(size is None or abs(size / scale["params"] - 1) <= 0.01 for size in sizes):
        return ""

    def size_words(size: int) -> str:
        per_param = f" ({scale['tokens'] / size:.1f} tokens per parameter)" if scale.get("tokens") else ""
        return f"{size / 1e6:.2f}M parameters{per_param}"

    return "; at its arms' own scale: " + " against ".join(size_words(size) for size in sizes if size)


def claims_table(claims: list[dict]) -> str:
    if not claims:
        return "The study's spec declares no claims (`claims:` in configs/study/<name>.yaml)."
    lines = [
        "| claim | source | statistic, where | arm vs against (mean over the seeds compared) | arm − against [95% CI] "
        "| p | p (Holm) | seeds | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        values = f"{number(c['value_arm'])} vs {number(c['value_against'])}" if "value_arm" in c else "–"
        difference = f"{c['difference']:+.3g}{interval(c.get('ci95'), '+.3g')}" if "difference" in c else "–"
        reason = f" ({c['reason']})" if c.get("reason") else ""
        reason += equivalence_words(c) + influence_words(c) + arm_scale_words(c)
        if c.get("paper_scale"):
            reason += f"; the paper's smallest setting: {c['paper_scale']}"
        expect = expectation(c)
        lines.append(
            f"| {c['claim']} (expect {expect}) | {c['source']} | {c['statistic']}, {c['read']} | "
            f"{c['arm']} vs {c['against']}: {values} | {difference} | {number(c.get('p'))} | "
            f"{number(c.get('p_holm'))} | {len(c.get('seeds', []))} | **{c['verdict']}**{reason} |"
        )
    return "\n".join(lines)


def observations(data: dict) -> list[str]:
    """What the numbers show for every variant before any claim, each sentence from a number in ``data``."""
    arms, baseline = data["variants"], data["baseline"]
    trained = {name: v for name, v in arms.items() if v["trained"]}
    ranked = sorted(
        (name for name in trained if trained[name]["lr_sensitivity"]["value"] is not None),
        key=lambda name: trained[name]["lr_sensitivity"]["value"],
    )
    if len(data["learning_rates"]) < MIN_COMMON_RATES:
        lines = [
            f"LR sensitivity is not compared: the variants share {len(data['learning_rates'])} rates, fewer than "
            f"the {MIN_COMMON_RATES} a sensitivity needs (each ran its own grid)."
        ]
    else:
        lines = [
            "LR sensitivity over the common grid (the mean of each selection seed's own value), lowest first, among the "
            "variants that trained: "
            + ", ".join(
                f"{name} {trained[name]['lr_sensitivity']['value']:.3f}{interval(trained[name]['lr_sensitivity']['ci95'])}"
                f" ({trained[name]['lr_sensitivity']['seeds']} seeds)"
                for name in ranked
            )
            + ". Intervals that overlap do not rank two variants."
        ]
    untrained = sorted(set(arms) - set(trained))
    if untrained:
        rule = (
            f"not {TRAINED_MARGIN} nats below the unigram loss of the validation windows ({data['unigram_loss']:.3f})"
            if data["unigram_loss"] is not None
            else f"more than {UNTRAINED_GAP} nats above {baseline}'s"
        )
        lines.append(
            f"{', '.join(untrained)}: best loss {rule} at every learning rate run, so they did not train in this "
            "budget; no claim about them is tested, and their LR sensitivity is left out of the ranking."
        )
    edge = sorted(name for name, v in arms.items() if not v["best_lr_inside"])
    if edge:
        lines.append(f"Best rate at an edge of the rates run even after the extra rates: {', '.join(edge)}.")
    for name, v in arms.items():
        c = v["against_baseline"]
        if not c or c["difference"] is None:
            continue
        evidence = f"p = {c['p']:.3g}" if c["p"] is not None else "one seed: no interval"
        lines.append(
            f"{name}: held-out loss at its best rate {c['difference']:+.3f}{interval(c['ci95'], '+.3f')} against "
            f"{baseline}'s at its own, over {len(c['seeds'])} report seeds ({evidence})."
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
    summaries, lrs = study.summaries, study.lrs
    evaluated = with_holm([evaluate_claim(claim, study) for claim in claims_of(results, inputs)])
    out.mkdir(parents=True, exist_ok=True)
    plot_loss_vs_lr(results, out / "loss_vs_lr.png")
    plot_loss_vs_step(results, {name: s.best_lr for name, s in summaries.items()}, out / "loss_vs_step.png")
    reference = study.reference_lr
    above = next((lr for lr in study.grid if reference is not None and lr > reference), None)
    logit_rates = [lr for lr in (reference, above) if lr is not None]
    own_best = {name: s.best_lr for name, s in summaries.items()}  # where the variants share no rate
    plot_attention_logits(results, logit_rates, out / "attention_logits.png", None if logit_rates else own_best)
    base = summaries[baseline]
    plot_depth_and_kurtosis(results, base.best_lr, out / "depth.png", out / "feature_kurtosis.png")

    data = study_json(study, metric, evaluated)
    table = [
        f"| variant | best lr (rates run) | held-out loss at best lr [95% CI] (report seeds) | Δ vs {baseline} [95% CI] "
        "| LR sensitivity [95% CI] (selection seeds) | trained | diverged at lr | "
        + " | ".join(f"lr {lr:g}" for lr in lrs)
        + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(lrs),
    ]
    for name, v in data["variants"].items():
        best, sens, c = v["best_loss"], v["lr_sensitivity"], v["against_baseline"]
        delta = "–" if not c or c["difference"] is None else f"{c['difference']:+.3f}{interval(c['ci95'], '+.3f')}"
        rates = f"{v['rates'][0]:g}–{v['rates'][-1]:g}" + ("" if v["best_lr_inside"] else ", at an edge")
        cells = [number(v["selection_loss_by_lr"].get(f"{lr:g}"), ".3f") if lr in v["rates"] else "" for lr in lrs]
        table.append(
            f"| {name} | {v['best_lr']:g} ({rates}) | {number(best['mean'], '.3f')}{interval(best['ci95'])} "
            f"({best['seeds']}) | {delta} | {number(sens['value'], '.3f')}{interval(sens['ci95'])} ({sens['seeds']}) | "
            f"{'yes' if v['trained'] else '**no**'} | {', '.join(f'{lr:g}' for lr in v['diverged_at_lr']) or '–'} | "
            + " | ".join(cells)
            + " |"
        )
    logit_note = (
        f"at lr {reference:g} (the highest shared rate at which every selection seed of the baseline trained)"
        + (f" and {above:g} (the next one up)" if above else "; no shared rate lies above it")
        if reference
        else "each variant at its own best rate (the variants share no rate at which the baseline trained)"
    )
    unigram_line = (
        f"unigram loss of the validation windows {study.unigram_loss:.3f} (a variant trained when its best is "
        f"{TRAINED_MARGIN} nats below it: {study.unigram_loss - TRAINED_MARGIN:.3f})"
        if study.unigram_loss is not None
        else "no unigram loss recorded"
    )
    shared = shared_switches([r.run.config["variant"] for r in results])
    recipe = f" Every variant's label also has `{'-'.join(shared)}`, left out below." if shared else ""
    title = (read_plan(inputs) or {}).get("title") or StudySpec.title
    rates = ", ".join(f"{lr:g}" for lr in study.grid)
    grid_line = (
        f"The common grid: {len(study.grid)} learning rates ({rates})"
        if len(study.grid) >= MIN_COMMON_RATES
        else f"Each variant ran its own grid of rates (the table's columns; they share {rates or 'none'})"
    )
    report = f"""# {title}

{len(results)} runs of {len(summaries)} variants. {grid_line}; further rates where a variant's best sat at an edge. Runs of
one seed share the data order and, where shapes agree, the initial weights, so variants are compared
paired by seed. Each variant's seeds ({seed_summary(data)}) have two jobs: its **selection seeds** ran every
rate and chose its best rate; its **report seeds** ran at that rate only, after it was chosen, and report
its loss there.
Metric `{metric}` on the selection windows, initial loss ln(vocabulary) = {results[0].initial_loss:.3f},
{unigram_line}.{recipe}

![final loss against learning rate](loss_vs_lr.png)

{chr(10).join(table)}

Each variant's best rate is chosen on `{metric}` (the selection windows), mean over its selection
seeds; its loss there is the mean over its report seeds on the held-out windows (`{HELDOUT_LOSS}`,
disjoint from the selection windows). Δ: that loss minus the baseline's at the baseline's own best rate,
paired by report seed. Per-rate columns: {metric} capped at the initial loss (a diverged run counts as
the initial loss), mean over the selection seeds. LR sensitivity (Wortsman et al. 2023, Sec. 3.1): on
each selection seed's own curve, the mean over the common grid of (capped loss − the best of them); the
value is the mean over seeds. Every interval is Student's t over seeds (95%), the p-value the paired
t-test on the same differences.

![validation loss against step, each variant at its best rate](loss_vs_step.png)

## What the numbers show

{chr(10).join("- " + line for line in observations(data))}

## Claims

Each claim as the study's spec declares it (arms chosen by config fields), evaluated by one rule
(lab/claims.py): **not tested** when an arm is missing, did not train, has its best rate at an edge,
is a configuration in which the statistic is bounded by construction, or lies outside the paper's regime;
otherwise the per-seed differences (arm − against; selection seeds for statistics of the whole curve, report
seeds for those read at the best rate) give the 95% interval, the p-value of the paired t-test (of the two
one-sided tests against the margin for "similar") and the verdict, which agree: no "agrees" at p ≥ 0.05.
Every verdict holds at this study's scale: {scale_words(data["scale"])}; a claim whose arms are of
another size names theirs in its row.

{claims_table(data["claims"])}

## Attention logits

The largest pre-softmax attention logit (max over layers) against step, {logit_note}:

![attention logits](attention_logits.png)

Each report seed's largest logit at the end, at its variant's best rate (`max_attn_logit_by_report_seed`):

{logit_table(data)}

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
            + " (`python -m lab across-models` compares the models, `--model` reports on another).\n"
        )
    return write_report_files(out, report, skipped, "study.json", data)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="the study's run folder (runs/stability), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("study"))
    parser.add_argument("--metric", default="val/loss", help="val/loss, or val/bpb across tokenizers")
    parser.add_argument("--speed", type=Path, default=None, help="a results.json from scripts/bench_variants.py")
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument("--model", default=None, help="the model to report on (default: the one with the most runs)")


def run(args: argparse.Namespace) -> int:
    return show_report(
        "report",
        lambda: write_report(args.inputs, args.out, args.metric, args.speed, args.baseline, args.model),
        args.out,
    )
