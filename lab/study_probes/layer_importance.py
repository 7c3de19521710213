"""What each block contributes: the angular distance it turns the residual stream by, and the loss without it.

Two measures the depth papers use (Mix-LN, Li et al. 2024, arXiv 2412.13795; The Curse of Depth,
Sun et al. 2025, arXiv 2502.05795; Gromov et al. 2024 for skipping):

- the *angular distance* between a block's input and output, the mean over tokens of
  arccos(cos(x_in, x_out)) / pi: 0 when the block leaves the stream's direction as it was (it
  could be skipped), 1/2 when it turns it orthogonal. A probe, logged as
  ``act/layers.{i}/angular_distance`` with the others;
- the *skip delta*: the validation loss with block i replaced by the identity, minus the plain
  loss. It needs a full evaluation per block, so it is ``eval.py layer_importance=true``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from training.telemetry.probes.base import Probe


def angular_distance(x_in: torch.Tensor, x_out: torch.Tensor) -> float:
    """Mean over tokens of arccos(cos(x_in, x_out)) / pi, in float64."""
    cosine = F.cosine_similarity(x_in.detach().double(), x_out.detach().double(), dim=-1).clamp(-1.0, 1.0)
    return (torch.arccos(cosine) / math.pi).mean().item()


class LayerImportance(Probe):
    keys = ("act/layers.{i}/angular_distance",)

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer, self._measure(index))

    def _measure(self, index: int):
        def measure(module, args, output) -> None:
            self.values[f"act/layers.{index}/angular_distance"] = angular_distance(args[0], output)

        return measure


class SkippedBlock(nn.Module):
    """A block replaced by the identity: the stream passes through unchanged."""

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return x


@contextmanager
def skipping(model: nn.Module, index: int):
    """``model`` with block ``index`` replaced by the identity, restored afterwards whatever happens."""
    block = model.layers[index]
    model.layers[index] = SkippedBlock()
    try:
        yield model
    finally:
        model.layers[index] = block


def skip_deltas(model: nn.Module, loss_of: Callable[[nn.Module], float]) -> list[float]:
    """Per block, ``loss_of(model without that block) - loss_of(model)``."""
    plain = loss_of(model)
    deltas = []
    for index in range(len(model.layers)):
        with skipping(model, index):
            deltas.append(loss_of(model) - plain)
    return deltas
