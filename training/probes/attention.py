"""Attention's pre-softmax logits and entropy, per layer, from q and k as the scores use them.

The logit growth that Wortsman et al. (2023) show QK-norm prevents is ``max_logit``; entropy
collapse is ``entropy``.
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import ScoresTap
from training.probes.base import Probe


@torch.no_grad()
def attention_stats(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The largest pre-softmax logit and the mean attention entropy (nats) over allowed positions.

    q is (batch, heads, seq, head_dim), k (batch, kv_heads, keys, head_dim), mask (seq, keys)
    True where attending is allowed.
    """
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    logits = (q.float() @ k.float().transpose(-1, -2)) / q.shape[-1] ** 0.5
    logits = logits.masked_fill(~mask, float("-inf"))
    p = logits.softmax(dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(dim=-1)
    return {"max_logit": logits.amax().item(), "entropy": entropy.mean().item()}


class AttentionLogits(Probe):
    keys = ("attn/layers.{i}/max_logit", "attn/layers.{i}/entropy")

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer.attn.scores, self._measure(index))

    def _measure(self, index: int):
        def measure(module: ScoresTap, args, output) -> None:
            q, k, start_pos = args
            seq = q.shape[2]
            allowed = torch.ones(seq, start_pos + seq, dtype=torch.bool, device=q.device).tril(start_pos)
            stats = attention_stats(q, k, allowed)
            self.values.update({f"attn/layers.{index}/{key}": value for key, value in stats.items()})

        return measure
