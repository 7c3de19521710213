"""Attention sinks (Xiao et al. 2023; Sun et al. 2024): heads that park their attention on the first
position. ``sink_mass`` is the mean weight that queries (all but the first, which can only attend
to itself) give position 0; ``sink_heads`` the share of heads whose own mean exceeds 0.3. The
weights are the softmax of the scores as the model forms them (after any soft-cap, with any learned
sink logit in the denominator: a learned sink takes weight that position 0 would otherwise hold).
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import Attention
from training.telemetry.probes.base import Probe

SINK_THRESHOLD = 0.3


@torch.no_grad()
def sink_stats(weights: torch.Tensor, threshold: float = SINK_THRESHOLD) -> dict[str, float]:
    """For attention weights (batch, heads, queries, keys) of a sequence from position 0: the mean
    weight on key 0 over queries 1.., and the share of heads whose mean exceeds ``threshold``."""
    on_first = weights[:, :, 1:, 0].float()  # query 0 has nowhere else to look
    per_head = on_first.mean(dim=(0, 2))
    return {"sink_mass": on_first.mean().item(), "sink_heads": (per_head > threshold).float().mean().item()}


class AttentionSinks(Probe):
    keys = ("attn/layers.{i}/sink_mass", "attn/layers.{i}/sink_heads")

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer.attn.scores_tap, self._measure(index, layer.attn))

    def _measure(self, index: int, attention: Attention):
        def measure(tap, args, output) -> None:
            q, k, start_pos = args
            if start_pos != 0 or q.shape[2] < 2:  # a cached decoding step does not see position 0 as a query would
                return
            weights = attention.softmax(attention.scores(q.float(), k.float(), 0))
            for key, value in sink_stats(weights).items():
                self.values[f"attn/layers.{index}/{key}"] = value

        return measure
