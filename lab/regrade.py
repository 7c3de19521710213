"""Judge a committed study's claims again under the current verdict engine and Holm's family correction.

    python -m lab regrade docs/study/depth/study.json --spec stability_depth
    python -m lab regrade docs/study/study.json --runs runs/remeasure   # values from reruns

Reads the per-seed values every tested claim keeps; a claim written before claims kept them gets them from
the study's cells where those determine its statistic, or from reruns of its seeds (``--runs``) for a
statistic of one run, and is otherwise not tested. Applies the engine's "not tested" rule where study.json
says an arm did not train, or where the spec's regime (``--spec``) excludes the depth of the claim's model,
recomputes each comparison, adds ``p_holm`` over the study's tested claims (one family), rewrites
study.json, and appends to the report.md beside it a section that lists every tested claim's p, adjusted p
and verdict before and after (the report's earlier claims table stays as the record of what it said).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.across_models import axis_words
from lab.claims import (
    equivalence_words,
    influence_words,
    outside_regime,
    regrade,
    seed_values_from_cells,
    seed_values_from_runs,
)
from lab.format import interval, number
from lab.results import VAL_LOSS, load_results
from lab.study_spec import load_study_spec

SECTION = "## Claims under Holm's correction"


def model_of(data: dict, claim: dict) -> dict:
    """The study.json as seen from a claim: in a study across models, with its own model's entries over the
    file's (lab/across_models.py)."""
    if "by_model" not in data:
        return data
    return {**data, **next(row for row in data["by_model"] if row["model"] == claim["model"])}


def section(claims: list[dict], axis: str | None) -> str:
    tested = [c for c in claims if c.get("p_holm") is not None]
    shown = [c for c in claims if c["verdict_before"] != "not tested"]
    lines = [
        SECTION,
        "",
        f"The study's {len(tested)} tested claims are one family: each verdict is judged again "
        "(`python -m lab regrade`) from its per-seed values (`values_arm`, `values_against` in study.json; "
        "where the study predates their record, read again from its cells, or measured on reruns of its seeds "
        "where `values_from` says so; the arms' values are then means over the paired seeds), and it agrees or "
        "disagrees only where Holm's adjusted p is below 0.05 "
        "as well; a claim whose arm did not train, whose model lies outside its paper's regime, or whose "
        "per-seed values are lost, is not tested. These rows supersede the verdicts above.",
        "",
        "| claim | where | difference [95% CI] | p | p (Holm) | verdict before | verdict now | per-seed values from |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in shown:
        where = axis_words(axis, c[axis]) if axis else "–"
        reason = (f" ({c['reason']})" if c.get("reason") else "") + equivalence_words(c) + influence_words(c)
        measured = "–" if c.get("difference") is None else f"{c['difference']:+.3g}{interval(c.get('ci95'), '+.3g')}"
        source = c.get("values_from") or ("study.json" if c.get("values_arm") is not None else "–")
        lines.append(
            f"| {c['claim']} | {where} | {measured} | {number(c.get('p'))} | {number(c.get('p_holm'))} | "
            f"{c['verdict_before']} | **{c['verdict']}**{reason} | {source} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study_json", type=Path)
    parser.add_argument("--spec", help="the study's spec (configs/study/<spec>.yaml): its claims' regimes, by depth")
    parser.add_argument("--runs", help="reruns of the claims' seeds, for claims whose per-seed values were not kept")


def run(args: argparse.Namespace) -> int:
    path = args.study_json
    if not path.is_file():
        print(f"lab regrade: no file {path}")
        return 1
    data = json.loads(path.read_text())
    specs = {c.claim: c for c in load_study_spec(args.spec).claims} if args.spec else {}

    def untrained(claim: dict) -> list[str]:
        arms = model_of(data, claim).get("variants", {})
        sides = [claim["arm"], claim["against"]]
        return [v for v in sides if v is not None and arms.get(v, {}).get("trained") is False]

    def regime_fails(claim: dict) -> str | None:
        spec, depth = specs.get(claim["claim"]), model_of(data, claim).get("n_layers")
        if spec is None or depth is None:
            return None
        why = outside_regime(spec, {"model.n_layers": depth})
        return None if why is None else f"outside the paper's regime: {why}"

    reruns = load_results([args.runs], VAL_LOSS)[0] if args.runs else []
    for claim in data["claims"]:
        if claim.get("verdict_before", claim["verdict"]) == "not tested" or claim.get("values_arm") is not None:
            continue
        if found := seed_values_from_cells(model_of(data, claim), claim):
            claim.update(found, values_from="the study's cells")
        elif reruns and (found := seed_values_from_runs(model_of(data, claim), claim, reruns)):
            claim.update(found, values_from="reruns of its seeds, not the runs first reported")
    claims = regrade(data["claims"], untrained, regime_fails)
    path.write_text(json.dumps(data, indent=1))
    report = path.with_name("report.md")
    if report.is_file():
        text = report.read_text().split("\n" + SECTION)[0].rstrip() + "\n\n"
        report.write_text(text + section(claims, data.get("axis")))
    changed = [c for c in claims if c["verdict"] != c["verdict_before"]]
    print(f"{path}: {len(changed)} of {len(claims)} verdicts changed")
    for c in changed:
        where = f" at {axis_words(data['axis'], c[data['axis']])}" if "axis" in data else ""
        print(f"  {c['claim']}{where}: {c['verdict_before']} -> {c['verdict']} ({c.get('reason') or ''})")
    return 0
