"""QK-clip (Kimi K2, arXiv 2507.20534): after each optimizer step, shrink the query and key
projections of every head whose largest pre-softmax logit in that step exceeded tau.

For a head h with largest logit S_h > tau, gamma_h = tau / S_h, and its logits q.k scale by the
product of its query's and key's factors. Without grouped-query attention each side gets
sqrt(gamma_h), so S_h would have been exactly tau. With grouped-query attention one key head
serves a group of query heads: here the shared key head is scaled by sqrt(min gamma of its
group) and each query head by sqrt(gamma_h) (1 for heads under tau). Every clipped head then
ends at or below tau (exactly tau for the group's largest), and a head under tau that shares a
key with a clipped one shrinks by at most sqrt(min gamma): conservative, never above tau.

The logits are the raw q k^T / sqrt(d) (before any soft-cap: what the weights produce), the
maximum over every micro-batch of the step and every process. With QK-norm the projections'
scale is normalized away, so the two are not combined (train.qk_clip is refused with norm.qk).
``train.qk_clip`` registers ``QKClip`` as a post-step hook (training/post_step.py).
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import Attention
from training.distributed import Distributed


def attentions(model: nn.Module) -> list[Attention]:
    return [module for module in model.modules() if isinstance(module, Attention)]


def track_max_logits(model: nn.Module) -> None:
    """Make every attention of ``model`` keep its heads' largest logits, which ``qk_clip`` reads (before compiling)."""
    for attention in attentions(model):
        attention.track_max_logits()


@torch.no_grad()
def clip_heads(attention: Attention, max_logits: torch.Tensor, tau: float) -> int:
    """Rescale ``attention``'s q and k rows for heads whose ``max_logits`` exceed ``tau``; returns how many."""
    over = max_logits > tau
    if not over.any():
        return 0
    gamma = torch.where(over, tau / max_logits, torch.ones_like(max_logits))
    hd, group = attention.head_dim, attention.n_heads // attention.n_kv_heads
    weight = attention.qkv_proj.weight  # rows [q heads | k heads | v heads], head_dim rows each
    q_rows = weight[: attention.n_heads * hd].view(attention.n_heads, hd, -1)
    q_rows.mul_(gamma.sqrt().to(weight.dtype)[:, None, None])
    k_rows = weight[attention.n_heads * hd : (attention.n_heads + attention.n_kv_heads) * hd]
    key_gamma = gamma.view(attention.n_kv_heads, group).amin(dim=1)
    k_rows.view(attention.n_kv_heads, hd, -1).mul_(key_gamma.sqrt().to(weight.dtype)[:, None, None])
    return int(over.sum())


@torch.no_grad()
def qk_clip(model: nn.Module, tau: float, dist: Distributed) -> int:
    """Clip every attention of ``model`` by the step's largest logits, reset them; the heads clipped."""
    clipped = 0
    for attention in attentions(model):
        max_logits = dist.max_(attention.max_logits.clone())
        clipped += clip_heads(attention, max_logits, tau)
        attention.max_logits.fill_(float("-inf"))
    return clipped


class QKClip:
    """QK-clip at ``tau`` as a post-step hook: built before the model is compiled (its attentions then keep
    their largest logits), called after every optimizer step, reporting the heads it clipped."""

    def __init__(self, model: nn.Module, tau: float, dist: Distributed) -> None:
        if model.on_sphere:
            raise ValueError(
                "train.qk_clip rescales the q and k projections, which nGPT renormalizes after every step "
                "(its logits are bounded by s_qk^2 sqrt(d_head)): drop train.qk_clip"
            )
        self.model, self.tau, self.dist = model, tau, dist
        track_max_logits(model)

    def __call__(self) -> dict[str, float]:
        return {"train/qk_clipped_heads": qk_clip(self.model, self.tau, self.dist)}
