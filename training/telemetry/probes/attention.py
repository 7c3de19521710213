"""Attention's pre-softmax logits (per layer and per head) and entropy, from q and k as the scores use them.

The logit growth that Wortsman et al. (2023) show QK-norm prevents is ``max_logit``; entropy
collapse is ``entropy``.
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import Attention
from training.telemetry.probes.base import Probe


@torch.no_grad()
def attention_stats(logits: torch.Tensor) -> dict:
    """The largest pre-softmax logit per layer and per query head, and the mean attention entropy
    (nats) over allowed positions, from ``logits`` (batch, heads, queries, keys) as the softmax
    receives them (``Attention.scores``: soft-capped where a variant caps them, -inf where attending is not allowed).
    """
    p = logits.softmax(dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(dim=-1)
    per_head = logits.amax(dim=(0, 2, 3)).tolist()
    return {"max_logit": max(per_head), "entropy": entropy.mean().item(), "per_head": per_head}


class AttentionLogits(Probe):
    keys = ("attn/layers.{i}/max_logit", "attn/layers.{i}/heads.{h}/max_logit", "attn/layers.{i}/entropy")

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer.attn.scores_tap, self._measure(index, layer.attn))

    def _measure(self, index: int, attention: Attention):
        def measure(tap, args, output) -> None:
            q, k, start_pos = args  # the logits before any learned sink joins them
            stats = attention_stats(attention.scores(q.float(), k.float(), start_pos))
            self.values[f"attn/layers.{index}/max_logit"] = stats["max_logit"]
            self.values[f"attn/layers.{index}/entropy"] = stats["entropy"]
            for head, value in enumerate(stats["per_head"]):
                self.values[f"attn/layers.{index}/heads.{head}/max_logit"] = value

        return measure
