"""training/step/nonfinite.py: what a step with a NaN or Inf loss does under each train.nan_policy."""

import math

import pytest

from training.step.nonfinite import NonFinitePolicy, StepAction, TrainingDiverged


def test_a_finite_step_is_applied_and_remembered():
    policy = NonFinitePolicy("stop", 5)
    assert policy.check(1, 4.2, 1.0, None) is StepAction.APPLY and policy.last_finite_loss == 4.2


def test_skip_drops_up_to_the_allowed_steps_then_stops():
    policy = NonFinitePolicy("skip", 2)
    assert [policy.check(s, math.nan, 1.0, None) for s in (1, 2)] == [StepAction.SKIP, StepAction.SKIP]
    with pytest.raises(TrainingDiverged, match="at step 3"):
        policy.check(3, math.nan, 1.0, None)


def test_record_ends_the_run_with_its_divergence_as_the_result():
    policy = NonFinitePolicy("record", 5)
    policy.check(1, 5.0, 1.0, None)
    assert policy.check(2, 4.0, math.inf, None) is StepAction.END
    assert policy.divergence_row(2, 4.0, math.inf) == {
        "step": 2,
        "diverged": True,
        "train/loss": 4.0,
        "train/grad_norm": math.inf,
        "train/last_finite_loss": 5.0,
    }


def test_stop_names_the_last_good_checkpoint_and_the_ways_out():
    with pytest.raises(TrainingDiverged, match="Last good checkpoint: runs/x/step_10.pt.*nan_policy=skip"):
        NonFinitePolicy("stop", 5).check(11, math.inf, 1.0, "runs/x/step_10.pt")
