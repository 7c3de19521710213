"""Attention's pre-softmax logits (per layer and per head) and entropy, from q and k as the scores use them.

The logit growth that Wortsman et al. (2023) show QK-norm prevents is ``max_logit``; entropy
collapse is ``entropy``.
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import ScoresTap, allowed_positions, attention_scores
from model.loss import softcap
from training.probes.base import Probe


@torch.no_grad()
def attention_stats(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, cap: float | None = None) -> dict:
    """The largest pre-softmax logit (as the softmax receives it: after any soft-cap), per layer and
    per query head, and the mean attention entropy (nats) over allowed positions.

    q is (batch, heads, seq, head_dim), k (batch, kv_heads, keys, head_dim), mask (seq, keys)
    True where attending is allowed.
    """
    logits = softcap(attention_scores(q.float(), k.float()), cap).masked_fill(~mask, float("-inf"))
    p = logits.softmax(dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(dim=-1)
    per_head = logits.amax(dim=(0, 2, 3)).tolist()
    return {"max_logit": max(per_head), "entropy": entropy.mean().item(), "per_head": per_head}


class AttentionLogits(Probe):
    keys = ("attn/layers.{i}/max_logit", "attn/layers.{i}/heads.{h}/max_logit", "attn/layers.{i}/entropy")

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer.attn.scores, self._measure(index))

    def _measure(self, index: int):
        def measure(module: ScoresTap, args, output) -> None:
            q, k, start_pos = args
            stats = attention_stats(q, k, allowed_positions(q.shape[2], start_pos, q.device), module.softcap)
            self.values[f"attn/layers.{index}/max_logit"] = stats["max_logit"]
            self.values[f"attn/layers.{index}/entropy"] = stats["entropy"]
            for head, value in enumerate(stats["per_head"]):
                self.values[f"attn/layers.{index}/heads.{head}/max_logit"] = value

        return measure
