"""Every committed study.json holds what a reader needs to check its verdicts: each tested claim's per-seed
values, from which the paired test gives its p again; Holm's adjusted p beside it; and a verdict of agrees or
disagrees only with the adjusted p below 0.05 and the interval on the side the verdict says."""

import json
from pathlib import Path

import pytest

from lab.stats import holm, paired_comparison

DOCS = Path(__file__).resolve().parents[3] / "docs"


STUDIES = sorted(DOCS.rglob("study.json"))


def claims_of(path: Path) -> list[dict]:
    """Every claim of a study.json (a study across models: each model's, one family)."""
    return json.loads(path.read_text())["claims"]


def claims_with_a_verdict():
    for path in STUDIES:
        for claim in claims_of(path):
            if claim["verdict"] != "not tested":
                yield pytest.param(claim, id=f"{path.parent.relative_to(DOCS)}: {claim['claim'][:60]}")


@pytest.mark.parametrize("claim", list(claims_with_a_verdict()))
def test_a_tested_claim_recomputes_from_its_per_seed_values(claim):
    values_arm, values_against = claim.get("values_arm"), claim.get("values_against")
    assert values_arm is not None and values_against is not None, "no per-seed values"
    assert len(claim["seeds"]) == len(values_arm) == len(values_against) >= 2
    again = paired_comparison(
        [a - b for a, b in zip(values_arm, values_against)], claim["expect"], claim.get("margin", 0.0)
    )
    assert again.p == pytest.approx(claim["p"], rel=1e-9) and again.ci95 == pytest.approx(claim["ci95"], rel=1e-9)
    assert again.verdict == claim["verdict"] or (claim["verdict"] == "inconclusive" and claim["p_holm"] >= 0.05)
    assert claim["p"] <= claim["p_holm"] <= 1
    if claim["verdict"] in ("agrees", "disagrees"):
        assert claim["p_holm"] < 0.05
        low, high = claim["ci95"]
        margin = claim.get("margin", 0.0)
        below = {
            "lower": high < 0,
            "higher": low > 0,
            "not_worse": high < margin,
            "similar": -margin < low < high < margin,
        }
        above = {
            "lower": low > 0,
            "higher": high < 0,
            "not_worse": low > margin,
            "similar": low > margin or high < -margin,
        }
        assert (below if claim["verdict"] == "agrees" else above)[claim["expect"]]


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: str(p.parent.relative_to(DOCS)))
def test_each_studys_tested_claims_are_one_family_under_holm(path):
    """A claim whose arms have not run yet (a study reported part way) stays in the family at p = 1."""
    tested = [c for c in claims_of(path) if c["verdict"] != "not tested"]
    unrun = [1.0 for c in claims_of(path) if c.get("unrun")]
    assert [c["p_holm"] for c in tested] == pytest.approx(
        holm([c["p"] for c in tested] + unrun)[: len(tested)], rel=1e-9
    )
