"""Massive activations (Sun et al. 2024, arXiv 2402.17762): a few features at a few positions of the
residual stream, orders of magnitude above the rest, acting as fixed biases.

For the stream leaving each block: the largest |h| over the median |h| (about 4-5 for a Gaussian,
in the thousands for a massive activation), and the position and feature where that largest
value sits.
"""

from __future__ import annotations

import torch
from torch import nn

from training.probes.base import Probe


@torch.no_grad()
def massive_stats(h: torch.Tensor) -> dict[str, float]:
    """``ratio`` = max |h| / median |h|, and the ``position`` (index in the sequence) and ``feature``
    of the max, for h of shape (batch, seq, features)."""
    magnitude = h.detach().abs().float()
    flat_index = int(magnitude.argmax())
    _, position, feature = torch.unravel_index(torch.tensor(flat_index), magnitude.shape)
    median = magnitude.median().item()
    peak = magnitude.flatten()[flat_index].item()
    return {"ratio": peak / median if median > 0 else float("inf"), "position": int(position), "feature": int(feature)}


class MassiveActivations(Probe):
    keys = ("act/layers.{i}/massive_ratio", "act/layers.{i}/massive_position", "act/layers.{i}/massive_feature")

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer, self._measure(index))

    def _measure(self, index: int):
        def measure(module, args, output) -> None:
            for key, value in massive_stats(output).items():
                self.values[f"act/layers.{index}/massive_{key}"] = value

        return measure
