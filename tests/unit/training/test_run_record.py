"""training/run/record.py: what identifies a run, and records written by older code."""

from training.run.resume import identity


def test_a_studys_claims_and_plan_in_an_older_record_do_not_change_the_runs_identity():
    """Before studies had specs, every run recorded its study's claims and plan; they never described what a
    run computes, so a run recorded with them is the same run as one recorded without (it resumes)."""
    now = {"train": {"lr": 0.01}, "seed": 0, "runtime": {"precision": "fp32", "global_batch_tokens": 1024}}
    older = {**now, "claims": [{"claim": "QK-norm lowers...", "not_tested": "by hand"}], "study_plan": {"headline": []}}
    assert identity(older) == identity(now)
    assert identity({**now, "train": {"lr": 0.02}}) != identity(now)  # what a run computes still counts
