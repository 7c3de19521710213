"""Norm gains folded into the linear layers that read them (FlashNorm, Graef et al. 2024, arXiv 2407.09577).

A norm's output ends with a per-feature gain g, and where only linear layers read that output,
W (g * n) = (W diag g) n: the gain can live in W's columns and the norm runs without one, the same
function with one multiply fewer per feature. A gain folds where the block says only linear layers read
the norm (``Block.gain_readers``: a pre-norm's input norms, read by the branch's input projections and
any gate), from the final norm into the LM head (untied from the embeddings), and from a norm on v into
the output projection (attention mixes positions, not
features, and a gate multiplies per feature too). It cannot fold from a norm whose output joins the
residual stream (post-norm, an output norm, HybridNorm's), feeds RoPE (q and k: it mixes pairs of
features) or a nonlinearity, nor from a norm that adds a bias after its gain: ``fold_gains`` then refuses,
naming the norm, before it changes anything.
"""

from __future__ import annotations

import torch
from torch import nn

from model.transformer import Transformer

# A linear layer that reads a norm, and for each of its input columns the gain entry that scales it.
Reader = tuple[nn.Linear, torch.Tensor]


def fold_plan(model: Transformer) -> dict[str, list[Reader]]:
    """Every norm with a gain, and the linear layers that would take it; a ValueError naming the first that cannot."""
    if model.on_sphere:
        raise ValueError("nGPT (norm=ngpt) has no gains to fold: its norms put vectors on the unit sphere")
    plan = {}
    for name, norm in model.norm_modules().items():
        if norm.effective_gain() is None and norm.output_scale == 1.0:
            continue  # nothing to fold (identity, L2, gain=none)
        if getattr(norm, "bias", None) is not None:
            raise ValueError(
                f"cannot fold {name}'s gain: {type(norm).__name__} adds a bias after it, which a linear layer "
                "without bias cannot take (train with norm.bias=false)"
            )
        readers = _readers(model, name)
        if readers is None:
            raise ValueError(f"cannot fold {name}'s gain: {_why_not(norm.role)}")
        plan[name] = readers
    return plan


@torch.no_grad()
def fold_gains(model: Transformer) -> list[str]:
    """Fold every norm's gain into the linear layers that read it (in place); the names of the norms folded."""
    plan = fold_plan(model)
    if "final_norm" in plan and model.cfg.tie_embeddings:  # the head takes the final gain: columns of its own
        model.lm_head.weight = nn.Parameter(model.tok_embeddings.weight.detach().clone())
        model.cfg.tie_embeddings = False  # the plan holds the head module, which now has that weight
    norms = model.norm_modules()
    for name, readers in plan.items():
        gain = norms[name].fold_gain()
        for linear, entries in readers:
            linear.weight.mul_(gain[entries].to(linear.weight.dtype))
    return list(plan)


def _readers(model: Transformer, name: str) -> list[Reader] | None:
    if name == "final_norm":
        return [(model.lm_head, torch.arange(model.cfg.d_model))]
    if not name.startswith("layers."):
        return None  # the embedding norm (model.outer_norm) feeds the residual stream
    _, index, attribute = name.split(".", 2)
    block = model.layers[int(index)]
    if attribute in block.gain_readers:
        linears = block.get_submodule(block.gain_readers[attribute]).input_linears()
        return [(linear, torch.arange(linear.in_features)) for linear in linears]
    if attribute == "attn.v_norm":
        return [(block.attn.o_proj, _v_entries(model))]
    return None


def _v_entries(model: Transformer) -> torch.Tensor:
    """For each column of the output projection (query head h, feature i), the v norm's gain entry: feature i of a
    per-head norm, or of h's key/value head in a norm over all heads (grouped-query attention)."""
    cfg = model.cfg
    head, feature = (
        torch.arange(cfg.n_heads).repeat_interleave(cfg.head_dim),
        torch.arange(cfg.head_dim).repeat(cfg.n_heads),
    )
    if cfg.norm.qk_axis == "head":
        return feature
    return head // (cfg.n_heads // cfg.n_kv_heads) * cfg.head_dim + feature


def _why_not(role: str | None) -> str:
    if role in ("q", "k", "q_proj", "k_proj"):
        return "q and k go through RoPE, which mixes pairs of features, before a product"
    if role in ("gate_proj", "up_proj", "v_proj"):
        return "norm.after_linear's norm here feeds SiLU or a product of two branches, not a linear layer alone"
    return "its output joins the residual stream, which more than a linear layer reads"
