"""The output logits, as the loss sees them (after any soft-cap): their largest value and mean log-partition.

``logits/log_z`` is the mean over tokens of logsumexp(logits), what z-loss pulls towards 0;
``logits/max`` the largest logit, what a final soft-cap bounds.
"""

from __future__ import annotations

import torch
from torch import nn

from training.telemetry.probes.base import Probe


class OutputLogits(Probe):
    keys = ("logits/max", "logits/log_z")

    def attach(self, model: nn.Module) -> None:
        self.hook(model, self._measure)

    def _measure(self, model, args, logits: torch.Tensor) -> None:
        logits = logits.detach().float()
        self.values["logits/max"] = logits.max().item()
        self.values["logits/log_z"] = torch.logsumexp(logits, dim=-1).mean().item()
