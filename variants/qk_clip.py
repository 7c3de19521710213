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
scale is normalized away, so the two are not combined (train.qk_clip is refused with norm.qk, HybridNorm's
placements and norm.after_linear).
Under train.parallel=fsdp each process rescales the rows of its own shard.
``train.qk_clip`` registers ``QKClip`` as a post-step hook (training/step/post_step.py).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from model.attention import Attention, masked_scores
from training.step.distributed import Distributed


def attentions(model: nn.Module) -> list[Attention]:
    return [module for module in model.modules() if isinstance(module, Attention)]


def track_max_logits(model: nn.Module) -> None:
    """Make every attention of ``model`` keep each query head's largest pre-softmax logit (uncapped) of the training
    forward passes since ``qk_clip`` last reset it, in a buffer ``max_logits``: a hook on the attention's scores tap
    (before compiling), which costs one extra q k^T."""
    for attention in attentions(model):
        device = attention.qkv_proj.weight.device
        attention.register_buffer("max_logits", torch.full((attention.n_heads,), float("-inf"), device=device), False)
        attention.scores_tap.register_forward_hook(functools.partial(_keep_max_logits, attention))


@torch.no_grad()
def _keep_max_logits(attention: Attention, tap: nn.Module, args: tuple, output) -> None:
    if attention.training:
        q, k, start_pos = args
        head_max = masked_scores(q, k, start_pos).amax(dim=(0, 2, 3))
        attention.max_logits.copy_(torch.maximum(attention.max_logits, head_max.to(attention.max_logits.dtype)))


def local_rows(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The rows of ``weight`` that this process holds, and the index of the first: all of them, or under
    train.parallel=fsdp its shard along dim 0 (FSDP2 gives rank r rows [r c, (r + 1) c), c = ceil(rows / ranks))."""
    if not isinstance(weight, DTensor):
        return weight, 0
    if tuple(weight.placements) != (Shard(0),):
        raise ValueError(f"QK-clip expects FSDP's row shards, got {weight.placements}: use train.parallel=ddp")
    per_rank = math.ceil(weight.shape[0] / weight.device_mesh.size())
    return weight.to_local(), min(weight.device_mesh.get_local_rank() * per_rank, weight.shape[0])


@torch.no_grad()
def clip_heads(attention: Attention, max_logits: torch.Tensor, tau: float) -> int:
    """Rescale ``attention``'s q and k rows for heads whose ``max_logits`` exceed ``tau``; returns how many."""
    over = max_logits > tau
    if not over.any():
        return 0
    gamma = torch.where(over, tau / max_logits, torch.ones_like(max_logits))
    group = attention.n_heads // attention.n_kv_heads
    key_gamma = gamma.view(attention.n_kv_heads, group).amin(dim=1)
    # one factor per row of the fused weight: [q heads | k heads | v heads], head_dim rows each
    factors = torch.cat([gamma.sqrt(), key_gamma.sqrt(), torch.ones_like(key_gamma)]).repeat_interleave(
        attention.head_dim
    )
    rows, first = local_rows(attention.qkv_proj.weight)
    rows.mul_(factors[first : first + rows.shape[0], None].to(rows.dtype))
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

    keys = ("train/qk_clipped_heads",)  # heads whose projections it rescaled after this step

    def __init__(self, model: nn.Module, tau: float, dist: Distributed) -> None:
        if model.on_sphere:
            raise ValueError(
                "train.qk_clip rescales the q and k projections, which nGPT renormalizes after every step "
                "(its logits are bounded by s_qk^2 sqrt(d_head)): drop train.qk_clip"
            )
        if any(attention.normalizes_qk for attention in attentions(model)):
            raise ValueError(
                "train.qk_clip rescales the q and k projections, whose scale this model's norms on q and k "
                "(norm.qk, norm.placement=hybrid or hybrid_star, norm.after_linear) normalize away: use one of them"
            )
        self.model, self.tau, self.dist = model, tau, dist
        track_max_logits(model)

    def __call__(self) -> dict[str, float]:
        return {self.keys[0]: qk_clip(self.model, self.tau, self.dist)}
