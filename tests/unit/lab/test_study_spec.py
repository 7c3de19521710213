"""lab/study_spec.py: a study's plan and claims, read from configs/study/ apart from the run schema."""

import pytest

from lab.claims import Claim
from lab.study_spec import StudySpecError, load_study_spec


def test_the_stability_spec_holds_its_plan_and_typed_claims():
    spec = load_study_spec("stability")
    assert {"rmsnorm", "layernorm", "prmsnorm", "rmsnorm_qk"} <= set(spec.plan.headline)
    assert spec.plan.headline_seeds >= 5 and spec.plan.selection_seeds >= 3 and spec.plan.report_seeds >= 5
    assert spec.claims and all(isinstance(claim, Claim) for claim in spec.claims)
    assert {claim.expect for claim in spec.claims} <= {"lower", "higher", "similar"}


def test_a_spec_extends_another_and_replaces_only_what_it_names():
    base, size = load_study_spec("stability"), load_study_spec("stability_size")
    assert size.claims == base.claims
    assert (size.plan.headline, size.plan.headline_seeds, size.plan.extra_rates) == (["rmsnorm", "rmsnorm_qk"], 5, 1)
    assert size.plan.seconds_per_run == base.plan.seconds_per_run  # not named: the base's


def test_overrides_change_the_plan(tmp_path):
    spec = load_study_spec("stability", ["plan.report_seeds=2", "plan.headline=[]"])
    assert spec.plan.report_seeds == 2 and spec.plan.headline == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("plan:\n  report_seed: 3\n", "report_seed"),  # misspelled
        ("plan:\n  report_seeds: many\n", "report_seeds"),  # wrong type
        ("claims:\n  - {claim: x, source: y, statistic: best_loss, expect: lowest}\n", "expect must be one of"),
    ],
)
def test_a_bad_spec_is_refused_with_its_file_and_key(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(StudySpecError, match=message) as err:
        load_study_spec("bad", folder=tmp_path)
    assert "bad.yaml" in str(err.value)


def test_a_missing_spec_names_the_specs_there(tmp_path):
    (tmp_path / "one.yaml").write_text("plan: {}\n")
    with pytest.raises(StudySpecError, match=r"no study spec .*two.yaml \(specs: one\)"):
        load_study_spec("two", folder=tmp_path)
