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


def matches(config_lookup, fields: dict[str, Any]) -> bool:
    """Whether a run's config has every ``fields`` value (``config_lookup(dotted)`` raises KeyError when absent)."""
    try:
        return all(config_lookup(key) == value for key, value in fields.items())
    except KeyError:
        return False
