"""What a training step with a non-finite loss or gradient does: ``train.nan_policy``, in one place.

- ``stop``: raise ``TrainingDiverged`` naming the last good checkpoint and the ways out;
- ``skip``: drop the step's update, up to ``train.max_skipped_steps`` times;
- ``record``: end the run with ``diverged: true`` in its metrics, its result (a learning-rate
  sweep goes on, and a rerun of it does not train that run again).
"""

from __future__ import annotations

import enum
import logging
import math

from training.errors import NormlabError

log = logging.getLogger(__name__)

NAN_POLICIES = ("stop", "skip", "record")


class TrainingDiverged(NormlabError, RuntimeError):
    """The loss or gradient became NaN/Inf and the nan_policy says stop."""


class StepAction(enum.Enum):
    """What the loop does with a step's update."""

    APPLY = "apply"  # finite: take the optimizer step
    SKIP = "skip"  # drop this step's update and go on
    END = "end"  # record the divergence and stop the run


class NonFinitePolicy:
    def __init__(self, policy: str, max_skipped: int) -> None:
        self.policy, self.max_skipped = policy, max_skipped
        self.skipped = 0
        self.last_finite_loss: float | None = None

    def check(self, step: int, loss: float, grad_norm: float, last_checkpoint) -> StepAction:
        """What to do with the step's update; raises ``TrainingDiverged`` under ``stop``."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.last_finite_loss = loss
            return StepAction.APPLY
        self.skipped += 1
        if self.policy == "skip" and self.skipped <= self.max_skipped:
            log.warning(
                "step %d: non-finite loss, step skipped (%d of %d allowed)", step, self.skipped, self.max_skipped
            )
            return StepAction.SKIP
        if self.policy == "record":
            log.warning(
                "step %d: loss %s, grad norm %s; the run diverged and ends here (recorded)", step, loss, grad_norm
            )
            return StepAction.END
        raise TrainingDiverged(
            f"loss became {loss} (grad norm {grad_norm}) at step {step}. Last good checkpoint: "
            f"{last_checkpoint or 'none yet'}. Lower train.lr or raise train.warmup_steps and rerun, "
            "or set train.nan_policy=skip to skip such steps (up to train.max_skipped_steps), "
            "or train.nan_policy=record to end the run with the divergence recorded."
        )

    def divergence_row(self, step: int, loss: float, grad_norm: float) -> dict:
        return {
            "step": step,
            "diverged": True,
            "train/loss": loss,
            "train/grad_norm": grad_norm,
            "train/last_finite_loss": self.last_finite_loss,
        }
