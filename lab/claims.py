"""Claims declared as data, and the one rule that turns a study's runs into their verdicts.

A study's spec lists its claims (configs/study/stability.yaml); each names the paper's finding,
two arms by config fields (never by parts of a label), or one arm and ``against: null`` for a
statistic that is itself a difference (the deeper half of a stack minus the first half, against 0),
a statistic, the direction the paper expects, and the preconditions under which the paper's finding
applies:

    - claim: QK-norm lowers the learning-rate sensitivity
      source: Wortsman et al. 2023, arXiv 2309.14322
      statistic: lr_sensitivity        # one of lab.study.STATISTICS
      arm: {norm.qk: rmsnorm}          # the variant whose runs have these config values
      against: {norm.qk: null}
      expect: lower                    # lower | higher | not_worse | similar (not_worse, similar: within `margin`)
      fixed_by: []                     # configs in which the statistic is bounded by construction
      regime: {}                       # the paper's regime, e.g. {model.n_layers: {min: 12}}
      requires: {}                     # what must be there to remove, e.g. {statistic: sink_mass_at_best, min: 0.1}

The rule, the same for every claim and decided by the engine, never by hand:

1. **not tested** when an arm is not in the runs; did not train (a statistic against an arm that never
   trained is fixed by construction, a claim that an arm fails to train included); has its best rate at
   an edge of the rates it ran; is a configuration in ``fixed_by`` (the statistic is fixed by construction there, so
   a difference is no finding); lies outside the paper's ``regime`` (compared with its own config); or the
   phenomenon the claim removes is not there (``requires``: the against arm's statistic below its minimum,
   e.g. attention sinks that never formed).
   The reason says which, with the numbers.
2. Otherwise the per-seed paired differences (arm minus against, on the seeds both arms have in the
   role the statistic needs; the arm's own values for a one-arm claim) go through ``lab.stats.paired_comparison``: **agrees**,
   **disagrees** or **inconclusive**, with the 95% interval and the p-value of the same test.
3. A study's tested claims are one family (``with_holm``): Holm's adjusted p sits beside p, and a claim
   agrees or disagrees only where the adjusted p is below 0.05 as well. A claim naming an arm that has no
   runs here (``unrun``: a study reported part way, one claim's arms first) stays in the family at p = 1, so
   such a report corrects at least as much as the finished study.
"""

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional  # noqa: UP035  # OmegaConf reads these annotations (the study spec schema)

from lab.results import Result, read_plan
from lab.runs import RunsError
from lab.stats import EXPECTATIONS, holm, paired_comparison, test_named
from lab.study import (
    MIN_COMMON_RATES,
    STATISTICS,
    Study,
    final_max_attn_logit,
    final_stream_growth,
    lr_sensitivity,
    matches,
    seeds_for,
)
from training.run.resume import flatten

# ruff: noqa: UP006, UP045

FAMILY_ALPHA = 0.05


@dataclass
class Claim:
    """One claim; also the schema of an entry of ``claims:`` in a study's spec."""

    claim: str  # the paper's finding, in words
    source: str  # where it comes from: authors, year, arXiv id
    statistic: str  # one of lab.study.STATISTICS
    arm: Dict[str, Any] = field(default_factory=dict)  # config fields (dotted) that pick the arm's variant
    # and the variant it is compared with; None: the arm's statistic against 0 (a statistic that is a difference)
    against: Optional[Dict[str, Any]] = field(default_factory=dict)
    expect: str = "lower"  # lower | higher | not_worse | similar: the arm's statistic against the other's
    # for not_worse, how much higher the arm's statistic may be and still count as no worse; for similar,
    # the largest difference either way that still counts as similar
    margin: float = 0.0
    # Configurations (config fields, as arm and against) in which the statistic is bounded by
    # construction: an arm that is one of them cannot test the claim.
    fixed_by: List[Dict[str, Any]] = field(default_factory=list)
    # The paper's regime: {dotted config key: {min: x} and/or {max: y}}, checked on both arms' configs.
    regime: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # What the claim is about must be there in the against arm: {statistic: <name>, min: x} (its mean over the
    # seeds that have it); a claim that a gate removes sinks cannot be tested where no sink formed.
    requires: Dict[str, Any] = field(default_factory=dict)
    # The paper's smallest setting in words, where it lies far from the study's scale ("151M parameters, 16
    # layers"): stated beside the verdict, which holds at the study's scale only.
    paper_scale: str = ""

    def __post_init__(self) -> None:
        if self.expect not in EXPECTATIONS:
            raise ValueError(
                f"claim {self.claim!r}: expect must be one of {', '.join(EXPECTATIONS)}, got {self.expect!r}"
            )
        if self.requires:
            needed = STATISTICS.get(self.requires.get("statistic"))
            if needed is None or needed.pairwise or "min" not in self.requires or self.against is None:
                raise ValueError(
                    f"claim {self.claim!r}: requires needs an against arm, a statistic of one arm (one of "
                    f"{', '.join(k for k, v in STATISTICS.items() if not v.pairwise)}) and a min, got {self.requires}"
                )
        if self.expect in ("similar", "not_worse") and not self.margin > 0:
            raise ValueError(
                f"claim {self.claim!r}: expect: {self.expect} needs a margin > 0 (the largest difference that still "
                "counts), e.g. margin: 0.05"
            )


def outside_regime(claim: Claim, flat: dict[str, Any]) -> str | None:
    """Why a run's flattened config lies outside the claim's regime (``model.n_layers = 4, the paper's from 12``),
    or None."""
    for key, bounds in claim.regime.items():
        value = flat.get(key)
        low, high = bounds.get("min"), bounds.get("max")
        if value is None or (low is not None and value < low) or (high is not None and value > high):
            paper = " to ".join(f"{b:g}" for b in (low, high) if b is not None)
            return f"{key} = {value}, where the paper's finding is for {'from ' if high is None else ''}{paper}"
    return None


def preconditions_fail(claim: Claim, study: Study, arm: str | None, against: str | None) -> str | None:
    """The reason a claim is not tested on these runs, or None when it is (the engine's one rule)."""
    sides = [(claim.arm, arm)] + ([(claim.against, against)] if claim.against is not None else [])
    missing = [str(fields) for fields, v in sides if v is None]
    if missing:
        return f"no variant in these runs has {' or '.join(missing)}"
    arms = [v for _, v in sides]
    untrained = sorted(set(arms) & study.untrained)
    if untrained:
        return f"{', '.join(untrained)} did not train at any rate here"
    if claim.statistic == "lr_sensitivity" and len(study.grid) < MIN_COMMON_RATES:
        return f"the variants share {len(study.grid)} rates, fewer than the {MIN_COMMON_RATES} a sensitivity compares"
    at_edge = sorted(v for v in set(arms) if not study.best_inside(v))
    if at_edge:
        return f"{', '.join(at_edge)}: best rate at an edge of the rates run, so its best is not known"
    for arm in arms:
        config = flatten(study.config(arm))
        bound = next((fields for fields in claim.fixed_by if matches(config.__getitem__, fields)), None)
        if bound is not None:
            return f"{claim.statistic} is bounded by construction in {arm} ({bound}), so a difference is no finding"
        if (why := outside_regime(claim, config)) is not None:
            return f"outside the paper's regime: {arm} has {why}"
    if claim.requires and against is not None:
        needed = STATISTICS[claim.requires["statistic"]]
        value = needed.compute(study, against, seeds_for(study, needed, against))
        if value is None or value < claim.requires["min"]:
            shown = "not measured" if value is None else f"{value:.3g}"
            return (
                f"what the claim removes is not there: {against}'s {claim.requires['statistic']} is {shown}, "
                f"below the {claim.requires['min']:g} the claim needs"
            )
    return None


def evaluate_claim(claim: Claim, study: Study) -> dict:
    """The claim with both arms' statistic (the mean over the seeds compared), the paired difference's
    95% interval, the p-value and the verdict of one paired comparison; or "not tested" and its reason."""
    if claim.statistic not in STATISTICS:
        raise RunsError(f"claim {claim.claim!r}: unknown statistic {claim.statistic!r}; one of {', '.join(STATISTICS)}")
    statistic = STATISTICS[claim.statistic]
    if statistic.pairwise and claim.against is None:
        raise RunsError(f"claim {claim.claim!r}: {claim.statistic} is read on two arms together; give it an `against`")
    arm = study.arm_with(claim.arm)
    against = study.arm_with(claim.against) if claim.against is not None else None
    result = {
        "claim": claim.claim,
        "source": claim.source,
        "statistic": claim.statistic,
        "read": statistic.where,
        "expect": claim.expect,
        "margin": claim.margin,
        "arm": arm,
        "against": against,
        **({"paper_scale": claim.paper_scale} if claim.paper_scale else {}),
    }
    reason = preconditions_fail(claim, study, arm, against)
    if reason is not None:
        unrun = arm is None or (claim.against is not None and against is None)
        return {**result, "verdict": "not tested", "reason": reason, **({"unrun": True} if unrun else {})}
    pairs = {}  # seed -> (arm's value, against's value, or 0 for a one-arm claim), for the seeds that have both
    for seed in seeds_for(study, statistic, *(v for v in (arm, against) if v is not None)):
        if statistic.pairwise:
            a, b = statistic.compute(study, arm, against, [seed]) or (None, None)
        else:
            a = statistic.compute(study, arm, [seed])
            b = statistic.compute(study, against, [seed]) if against is not None else 0.0
        if a is not None and b is not None:
            pairs[seed] = (a, b)
    if not pairs:
        # an arm whose report seeds have not run yet is a study reported part way: unrun, like a missing arm
        waiting = statistic.seeds == "report" and any(
            not study.summaries[v].report_seeds for v in (arm, against) if v is not None
        )
        return {
            **result,
            "verdict": "not tested",
            "reason": "its report seeds have not run yet"
            if waiting
            else f"no {statistic.seeds} seed has {claim.statistic} in both arms",
            **({"unrun": True} if waiting else {}),
        }
    comparison = paired_comparison([a - b for a, b in pairs.values()], claim.expect, claim.margin)
    result.update(
        value_arm=sum(a for a, _ in pairs.values()) / len(pairs),
        value_against=sum(b for _, b in pairs.values()) / len(pairs),
        difference=comparison.difference,
        ci95=comparison.ci95,
        p=comparison.p,
        test=test_named(claim.expect, claim.margin),
        seeds=list(pairs),
        # each seed's values, in the order of ``seeds``: the paired test can be recomputed from the JSON
        values_arm=[a for a, _ in pairs.values()],
        values_against=[b for _, b in pairs.values()],
        verdict=comparison.verdict,
    )
    if comparison.ci95 is None:
        result["reason"] = "one seed: no interval"
    return with_influence(with_equivalence(result))


def paired_differences(claim: dict) -> list[float]:
    """A tested claim's per-seed differences, arm minus against, from the values its study.json keeps."""
    return [a - b for a, b in zip(claim["values_arm"], claim["values_against"])]


def with_equivalence(claim: dict) -> dict:
    """A non-inferiority claim with its equivalence reading beside it (``equivalence``: the same differences
    within ±margin, two one-sided tests): a parity claim read both ways, so that a verdict that holds under one
    reading only says so. Holm's correction of it is ``with_holm``'s."""
    if claim["expect"] == "not_worse" and claim.get("values_arm") is not None:
        differences = paired_differences(claim)
        comparison = paired_comparison(differences, "similar", claim["margin"])
        claim["equivalence"] = {
            "verdict": comparison.verdict,
            "p": comparison.p,
            "test": test_named("similar", claim["margin"]),
        }
    return claim


def with_influence(claim: dict) -> dict:
    """A tested claim with its most influential seed beside it (``most_influential_seed``): the seed whose
    difference lies furthest from the mean (removing it moves the mean most), and the difference, interval and
    p of the same test without it. A reading, never a verdict: it shows whether one seed (a stalled run)
    decides the claim. Only where 3 seeds or more remain."""
    if claim.get("values_arm") is None or len(claim["values_arm"]) < 4:
        return claim
    differences = paired_differences(claim)
    mean = statistics.fmean(differences)
    index = max(range(len(differences)), key=lambda i: abs(differences[i] - mean))
    rest = paired_comparison(
        differences[:index] + differences[index + 1 :], claim["expect"], claim.get("margin") or 0.0
    )
    seeds = claim.get("seeds")
    claim["most_influential_seed"] = {
        "seed": seeds[index] if isinstance(seeds, list) else None,
        "difference": rest.difference,
        "ci95": list(rest.ci95),
        "p": rest.p,
    }
    return claim


def influence_words(claim: dict) -> str:
    """A claim's most influential seed in words, for the tables beside its verdict ("" where it has none)."""
    seed = claim.get("most_influential_seed")
    if seed is None:
        return ""
    low, high = seed["ci95"]
    return (
        f"; without seed {seed['seed']}, the most influential: {seed['difference']:+.3g} [{low:+.3g}, {high:+.3g}], "
        f"p {seed['p']:.3g} unadjusted, the seed chosen after the fact (a reading, not a verdict)"
    )


READINGS = {"not_worse": "non-inferiority", "similar": "equivalence"}


def equivalence_words(claim: dict) -> str:
    """A parity claim's equivalence reading, and the smallest margin each reading decides, in words, for the
    tables beside its verdict ("" for other claims)."""
    other = claim.get("equivalence")
    words = ""
    if other is not None:
        p_holm = "–" if other.get("p_holm") is None else f"{other['p_holm']:.3g}"
        words = f"; read as equivalence within ±{claim['margin']:g}: {other['verdict']} (p_holm {p_holm})"
    readings = ((READINGS.get(claim["expect"]), claim), ("equivalence", other or {}))
    return words + "".join(
        f"; {name} agrees at margins from {reading['margin_agrees_from']:.3g} after Holm"
        for name, reading in readings
        if reading.get("margin_agrees_from") is not None
    )


def with_holm(evaluated: list[dict]) -> list[dict]:
    """A study's evaluated claims as one family: ``p_holm`` (Holm's adjusted p over every claim that has a
    p) beside ``p``, and a verdict of agrees or disagrees kept only where ``p_holm`` < 0.05 too; a verdict
    that does not survive reads inconclusive, and ``reason`` says so with both p-values. Each claim whose
    arms have not run yet (``unrun``) counts in the family at p = 1."""
    tested = [c for c in evaluated if c.get("p") is not None and c["verdict"] != "not tested"]
    unrun = [1.0] * sum(1 for c in evaluated if c.get("unrun"))
    family = f"{len(tested)} tested claims" + (
        f" and {len(unrun)} whose arms are not in these runs, at p = 1" if unrun else ""
    )
    for claim, adjusted in zip(tested, holm([c["p"] for c in tested] + unrun)):
        claim["p_holm"] = adjusted
        if claim["verdict"] in ("agrees", "disagrees") and not adjusted < FAMILY_ALPHA:
            claim["reason"] = (
                f"{claim['verdict']} at p = {claim['p']:.3g}, but not after Holm's correction over the study's "
                f"{family} (p_holm = {adjusted:.3g})"
            )
            claim["verdict"] = "inconclusive"
    for index, claim in enumerate(tested):  # the other reading, in the same family in the claim's place
        other = claim.get("equivalence")
        if other is not None and other["p"] is not None:
            other["p_holm"] = holm_in_place(tested, unrun, index, other["p"])
            if other["verdict"] in ("agrees", "disagrees") and not other["p_holm"] < FAMILY_ALPHA:
                other["verdict"] = "inconclusive"
        for reading, expect in ((claim, claim.get("expect")), (other, "similar")):
            if reading is not None and expect in ("not_worse", "similar") and claim.get("values_arm"):
                reading["margin_agrees_from"] = smallest_margin_agreeing(tested, unrun, index, expect)
    return evaluated


def holm_in_place(tested: list[dict], unrun: list[float], index: int, p: float) -> float:
    """Holm's adjusted p of claim ``index`` with ``p`` in its place, the family otherwise as it is: another
    reading of the same claim, or the same reading at another margin."""
    return holm([c["p"] if i != index else p for i, c in enumerate(tested)] + unrun)[index]


def smallest_margin_agreeing(tested: list[dict], unrun: list[float], index: int, expect: str) -> float:
    """The smallest margin at which claim ``index`` would agree as ``expect`` (``not_worse`` or ``similar``)
    after Holm's correction, the other claims' p held: for a practitioner whose margin is below it, these seeds
    say inconclusive or disagrees. Each reading's p falls as the margin grows, so bisection finds it."""
    claim = tested[index]
    differences = paired_differences(claim)

    def decided(margin: float) -> bool:
        p = paired_comparison(differences, expect, margin).p
        return holm_in_place(tested, unrun, index, p) < FAMILY_ALPHA

    low = max(statistics.fmean(differences) if expect == "not_worse" else abs(statistics.fmean(differences)), 0.0)
    high = low + max(statistics.pstdev(differences), 1e-9)
    while not decided(high):
        low, high = high, 2 * high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (low, middle) if decided(middle) else (middle, high)
    return high


def claims_of(results: list[Result], inputs: list[str] | None = None) -> list[Claim]:
    """The claims the study declares: as python -m lab study recorded them in the study's folder (its
    spec's current ``claims:``), else as runs recorded before studies had specs hold them, once each."""
    plan = read_plan(inputs or [])
    specs = (
        plan["claims"] if plan and "claims" in plan else [c for r in results for c in r.run.config.get("claims") or []]
    )
    known = set(Claim.__dataclass_fields__)
    found: dict[str, Claim] = {}
    for spec in specs:  # keys a claim no longer has (``not_tested``) are dropped: the rule above decides that
        found.setdefault(spec["claim"], Claim(**{k: v for k, v in spec.items() if k in known}))
    return list(found.values())


def _seeds_asked(data: dict, claim: dict) -> list[int]:
    """The claim's seeds; a count (a study.json older than seed lists) stands for the first seeds that both arms
    ran in the role the statistic reads them in (selection seeds, called grid seeds then; or report seeds)."""
    if isinstance(claim["seeds"], list):
        return claim["seeds"]
    role = (
        ("selection_seeds", "grid_seeds") if STATISTICS[claim["statistic"]].seeds == "selection" else ("report_seeds",)
    )
    ran = [
        next((v[key] for key in role if key in v), [])
        for v in (data["variants"][claim["arm"]], data["variants"][claim["against"]])
    ]
    return sorted(set(ran[0]) & set(ran[1]))[: claim["seeds"]]


def _values_of(claim: dict, seeds: list[int], value: Callable[[str, int], float | None]) -> dict | None:
    pairs = [(value(claim["arm"], s), value(claim["against"], s)) for s in seeds]
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    return {"seeds": seeds, "values_arm": [a for a, _ in pairs], "values_against": [b for _, b in pairs]}


def seed_values_from_cells(data: dict, claim: dict) -> dict | None:
    """A claim's per-seed values (``seeds``, ``values_arm``, ``values_against``) read again from the ``cells`` a
    study.json keeps (each run's final and held-out loss), for a claim written before claims kept them:
    ``best_loss`` at each arm's best rate, ``lr_sensitivity`` of each seed's own curve over the study's rates,
    capped at the initial loss, as the engine reads them. None for a statistic the cells do not determine
    (one of curves or probes), or where a seed lacks a cell."""
    if claim["statistic"] not in ("best_loss", "lr_sensitivity") or not data.get("cells") or claim["against"] is None:
        return None
    cells = {(c["variant"], c["lr"], c["seed"]): c for c in data["cells"]}
    initial = data["initial_loss"]

    def capped(cell: dict) -> float:
        return initial if cell["diverged"] or cell["loss"] is None else min(cell["loss"], initial)

    def value(arm: str, seed: int) -> float | None:
        if claim["statistic"] == "best_loss":
            cell = cells.get((arm, data["variants"][arm]["best_lr"], seed))
            if cell is None:
                return None
            held = cell.get("heldout_loss")
            return capped(cell) if held is None or cell["diverged"] else min(held, initial)
        curve = [cells.get((arm, lr, seed)) for lr in data["learning_rates"]]
        return None if None in curve else lr_sensitivity({c["lr"]: capped(c) for c in curve})

    return _values_of(claim, _seeds_asked(data, claim), value)


# The statistics of one run at a rate its study.json names: where it is read, and the run's value.
RUN_STATISTICS: dict[str, tuple[Callable[[dict], float | None], Callable[[Result], float | None]]] = {
    "stream_growth": (
        lambda data: data["variants"][data["baseline"]]["best_lr"] if "baseline" in data else None,
        final_stream_growth,
    ),
    "max_attn_logit": (lambda data: data.get("reference_lr"), final_max_attn_logit),
}


def seed_values_from_runs(data: dict, claim: dict, results: list[Result]) -> dict | None:
    """A claim's per-seed values measured on reruns of its seeds (``results``, labelled as the study's variants),
    for a statistic of one run at a rate the study.json names (``RUN_STATISTICS``): where neither the claim nor
    its cells kept them. None for another statistic, or where a seed's run is missing."""
    if claim["statistic"] not in RUN_STATISTICS or claim["against"] is None:
        return None
    rate_of, value_of = RUN_STATISTICS[claim["statistic"]]
    rate = rate_of(data)
    if rate is None:  # a study.json older than the rate's record
        return None
    runs = {(r.arm, r.lr, r.seed): r for r in results}

    def value(arm: str, seed: int) -> float | None:
        run = runs.get((arm, rate, seed))
        return None if run is None else value_of(run)

    return _values_of(claim, _seeds_asked(data, claim), value)


def regrade(
    claims: list[dict], untrained: Callable[[dict], list[str]], regime_fails: Callable[[dict], str | None]
) -> list[dict]:
    """A committed study's claims judged again by the current engine and family rule, from what its study.json
    keeps (no runs needed). A claim whose arm did not train (``untrained(claim)`` names them) or whose model lies
    outside its paper's regime (``regime_fails(claim)`` says why) is not tested, and so is one without per-seed
    values (its paired test cannot be recomputed); every other claim is compared again from
    ``values_arm - values_against`` with its ``expect`` and ``margin`` (``value_arm`` and ``value_against``
    become the means over those seeds); then Holm's correction over the tested ones (``with_holm``). Each claim keeps the
    ``verdict_before`` of its first judgement, and every claim tested then is judged again (a claim found
    without values once is tested once they are found)."""
    for claim in claims:
        claim.setdefault("verdict_before", claim["verdict"])
        if claim["verdict_before"] == "not tested":  # its first reason (an edge, a bound, a regime) stands
            continue
        why = ", ".join(untrained(claim))
        why = f"{why} did not train at any rate here" if why else regime_fails(claim)
        if why is None and claim.get("values_arm") is None:
            why = "its per-seed values were not kept, and neither its study.json nor its runs have them: its paired test cannot be recomputed"
        if why:
            for key in (
                "difference",
                "ci95",
                "p",
                "p_holm",
                "test",
                "value_arm",
                "value_against",
                "most_influential_seed",
                "equivalence",
            ):
                claim.pop(key, None)
            claim.update(verdict="not tested", reason=why)
            continue
        claim.pop("reason", None)  # a tested claim's reason is the family's, given again below
        differences = paired_differences(claim)
        comparison = paired_comparison(differences, claim["expect"], claim.get("margin", 0.0))
        claim.update(
            value_arm=statistics.fmean(claim["values_arm"]),
            value_against=statistics.fmean(claim["values_against"]),
            difference=comparison.difference,
            ci95=comparison.ci95,
            p=comparison.p,
            test=test_named(claim["expect"], claim.get("margin", 0.0)),
            verdict=comparison.verdict,
        )
        with_influence(with_equivalence(claim))
    return with_holm(claims)
