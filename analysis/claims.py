"""Claims declared as data, evaluated on a study's runs.

A study's spec lists its claims (configs/study/stability.yaml); each names the
paper's finding, two arms by config fields (never by parts of a label), a statistic and the
direction the paper expects:

    - claim: QK-norm lowers the learning-rate sensitivity
      source: Wortsman et al. 2023, arXiv 2309.14322
      statistic: lr_sensitivity        # one of analysis.study.STATISTICS
      arm: {norm.qk: rmsnorm}          # the variant whose runs have these config values
      against: {norm.qk: null}
      expect: lower                    # lower | higher | similar (within `margin`)

The verdict follows the interval of the paired difference (arm minus against, runs paired by
seed): ``agrees`` or ``disagrees`` only when the 95% interval excludes the other outcome,
``inconclusive`` otherwise (one seed gives no interval), ``not tested`` when an arm is not in the
runs, did not train, or the claim says why (``not_tested: the paper's recipe was not run``).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional  # noqa: UP035  # OmegaConf reads these annotations (the config schema)

from analysis.results import Result, read_plan
from analysis.runs import RunsError
from analysis.stats import bootstrap_ci, paired_p_value
from analysis.study import STATISTICS, Study

# ruff: noqa: UP006, UP045

EXPECTATIONS = ("lower", "higher", "similar")


@dataclass
class Claim:
    """One claim; also the schema of an entry of ``claims:`` in a study's spec."""

    claim: str  # the paper's finding, in words
    source: str  # where it comes from: authors, year, arXiv id
    statistic: str  # lr_sensitivity | best_loss | stream_growth | max_attn_logit (analysis.study.STATISTICS)
    arm: Dict[str, Any] = field(default_factory=dict)  # config fields (dotted) that pick the arm's variant
    against: Dict[str, Any] = field(default_factory=dict)  # and the variant it is compared with
    expect: str = "lower"  # lower | higher | similar: the arm's statistic against the other's
    margin: float = 0.0  # for expect: similar, the largest difference that still counts as similar
    not_tested: Optional[str] = None  # why this study cannot test the claim, if it cannot

    def __post_init__(self) -> None:
        if self.expect not in EXPECTATIONS:
            raise ValueError(
                f"claim {self.claim!r}: expect must be one of {', '.join(EXPECTATIONS)}, got {self.expect!r}"
            )


def verdict(expect: str, ci: Optional[tuple], margin: float = 0.0) -> str:
    """agrees / disagrees / inconclusive from the 95% interval of arm minus against."""
    if ci is None:
        return "inconclusive"
    low, high = ci
    if expect == "lower":
        return "agrees" if high < 0 else "disagrees" if low > 0 else "inconclusive"
    if expect == "higher":
        return "agrees" if low > 0 else "disagrees" if high < 0 else "inconclusive"
    if -margin <= low and high <= margin:
        return "agrees"
    return "disagrees" if low > margin or high < -margin else "inconclusive"


def evaluate_claim(claim: Claim, study: Study) -> dict:
    """The claim with both arms' statistic, their paired difference (95% bootstrap interval over
    seeds, paired t-test p-value) and the verdict that the interval supports. A claim that says why
    it is not tested (``not_tested:``) keeps its numbers where they exist, and that verdict."""
    if claim.statistic not in STATISTICS:
        raise RunsError(f"claim {claim.claim!r}: unknown statistic {claim.statistic!r}; one of {', '.join(STATISTICS)}")
    result = {"claim": claim.claim, "source": claim.source, "statistic": claim.statistic, "expect": claim.expect}
    arm, against = study.variant_with(claim.arm), study.variant_with(claim.against)
    result.update(arm=arm, against=against)

    def not_tested(why: str) -> dict:
        return {**result, "verdict": "not tested", "why": claim.not_tested or why}

    missing = [str(fields) for fields, v in ((claim.arm, arm), (claim.against, against)) if v is None]
    if missing:
        return not_tested(f"no variant in these runs has {' or '.join(missing)}")
    untrained = sorted({arm, against} & study.untrained)
    if untrained:
        return not_tested(f"{', '.join(untrained)} did not train at any rate here, so the study cannot show this")
    at_edge = sorted(v for v in (arm, against) if not study.best_inside(v))
    if at_edge:
        return not_tested(f"{', '.join(at_edge)}: best rate at an edge of the rates run, so its best is not known")
    stat = STATISTICS[claim.statistic]
    seeds = [s for s in study.seeds if stat(study, arm, [s]) is not None and stat(study, against, [s]) is not None]
    if not seeds:
        return not_tested(f"no seed has {claim.statistic} for both arms")
    a, b = stat(study, arm, seeds), stat(study, against, seeds)

    def difference(sample) -> float:
        seeds_drawn = [int(s) for s in sample]
        return stat(study, arm, seeds_drawn) - stat(study, against, seeds_drawn)

    ci = bootstrap_ci(seeds, difference, resamples=2000) if len(seeds) > 1 else None
    p = paired_p_value([stat(study, arm, [s]) for s in seeds], [stat(study, against, [s]) for s in seeds])
    result.update(value_arm=a, value_against=b, difference=a - b, ci95=ci, p=p, seeds=len(seeds))
    if claim.not_tested:
        return not_tested("")
    result["verdict"] = verdict(claim.expect, ci, claim.margin)
    if ci is None:
        result["why"] = "one seed: no interval"
    return result


def claims_of(results: list[Result], inputs: list[str] | None = None) -> list[Claim]:
    """The claims the study declares: as scripts/run_study.py recorded them in the study's folder
    (the experiment config's current ``claims:``), else as the runs' records hold them, once each."""
    plan = read_plan(inputs or [])
    specs = (
        plan["claims"] if plan and "claims" in plan else [c for r in results for c in r.run.config.get("claims") or []]
    )
    found: dict[str, Claim] = {}
    for spec in specs:
        found.setdefault(spec["claim"], Claim(**spec))
    return list(found.values())
