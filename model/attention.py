"""Causal grouped-query self-attention with optional norms on q, k and v, an output gate, learned sinks,
a score soft-cap, and a key/value cache.

    QKV-norm     q, k (QK-norm) and v normalized per head or over all heads, before RoPE
    after-linear SimpleNorm's norm right after the q, k, v and output projections (norm.after_linear)
    gate         out_h * sigmoid(x W_g), per head (headwise) or per feature (elementwise), from the
                 attention's input x, applied to SDPA's output before the output projection (Qiu et al. 2025)
    sink         a learned logit s_h per head that joins the softmax's denominator and attends to nothing:
                 weights exp(z_j) / (exp(s_h) + sum_i exp(z_i)) (gpt-oss)

Plain attention runs in SDPA (fused, the scores never materialized). A soft-cap on the scores
(Gemma 2: ``c * tanh(s / c)``) and a sink's extra logit are things SDPA cannot apply, so such a
model takes an explicit path that forms the scores; ``scripts/bench_variants.py`` measures what that costs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.loss import softcap
from model.norm_roles import norm_for
from model.rope import apply_rope


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Pre-softmax scores q k^T * scale, (batch, heads, seq, keys), each key head serving its query group;
    ``scale`` None is 1/sqrt(head_dim)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)


def sink_softmax(scores: torch.Tensor, sink_logits: torch.Tensor | None) -> torch.Tensor:
    """softmax over the keys of ``scores`` (batch, heads, queries, keys), with each head's sink logit in the
    denominator when given (the weights then sum to less than one: the rest goes to the sink)."""
    if sink_logits is None:
        return scores.softmax(dim=-1)
    sink = sink_logits.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    return torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]


def allowed_positions(seq: int, start_pos: int, device) -> torch.Tensor:
    """(seq, start_pos + seq), True where query i may attend key j: causal within, all of the cached past."""
    return torch.ones(seq, start_pos + seq, dtype=torch.bool, device=device).tril(start_pos)


def masked_scores(
    q: torch.Tensor, k: torch.Tensor, start_pos: int, cap: float | None = None, scale: float | None = None
) -> torch.Tensor:
    """The scores as the softmax receives them: q k^T * scale (1/sqrt(d) by default) in float32 at least,
    soft-capped when ``cap`` is set, -inf where a query may not attend (the explicit path, QK-clip's maxima,
    probes). The product itself runs in float32 at least: under bf16 autocast it would round the scores first."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        scores = softcap(attention_scores(q.to(dtype), k.to(dtype), scale), cap)
    return scores.masked_fill(~allowed_positions(q.shape[2], start_pos, q.device), float("-inf"))


class KVCache:
    """Preallocated keys and values of one layer, so each generated token costs one new row."""

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, like: torch.Tensor) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.values = torch.zeros(shape, dtype=like.dtype, device=like.device)

    def update(self, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Store rows [start, start + T) and return all keys and values up to there."""
        end = start + k.shape[2]
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]


class ScoresTap(nn.Module):
    """Where the attention scores are formed: a no-op that hands the rotated q and k to forward hooks.

    SDPA never materializes the scores; a probe that needs them (training/probes/attention.py)
    hooks this module and computes them on its own pass, so training steps pay nothing.
    ``softcap`` is the cap the softmax's scores get (None for none) and ``scale`` the softmax scale
    (None: 1/sqrt(d_head)), for probes to apply; the hooks' last argument is the heads' sink logits
    (None without sinks), for ``sink_softmax``.
    """

    def __init__(self, softcap: float | None, scale: float | None = None) -> None:
        super().__init__()
        self.softcap, self.scale = softcap, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, start_pos: int, sink_logits: torch.Tensor | None) -> None:
        return None


class Attention(nn.Module):
    """``normed``: the roles among q, k and v that a block's placement normalizes whatever the config says
    (HybridNorm's QKV-norm); the config adds q and k with ``qk_norm`` and v with ``v_norm``."""

    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        # q, k and v from one matmul (rows [q | k | v]): one launch instead of three.
        self.qkv_proj = nn.Linear(cfg.d_model, q_size + 2 * kv_size, bias=False)
        self.qk_axis = cfg.qk_axis
        normed = {*normed, *(("q", "k") if cfg.qk_norm else ()), *(("v",) if cfg.v_norm else ())}
        if normed and cfg.after_linear_norm is not None:
            raise ValueError(
                f"norm.after_linear normalizes q, k and v after their projections, which norm.qk, norm.v or the "
                f"placement normalizes again ({', '.join(sorted(normed))}): drop one of them"
            )
        per_head = cfg.qk_axis == "head"
        for role, heads in (("q", cfg.n_heads), ("k", cfg.n_kv_heads), ("v", cfg.n_kv_heads)):
            if role in normed:
                setattr(self, f"{role}_norm", norm_for(cfg, role, cfg.head_dim if per_head else heads * cfg.head_dim))
        self.o_proj = nn.Linear(q_size, cfg.d_model, bias=False)
        if cfg.after_linear_norm is not None:  # SimpleNorm: each projection's output normalized as a whole
            for name, size in (("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size), ("o_proj", cfg.d_model)):
                setattr(self, f"{name}_norm", norm_for(cfg, name, size))
        if cfg.attn_gate != "none":  # one gate logit per head, or per feature of each head
            with torch.random.fork_rng(devices=[]):  # drawing it must not shift the weights every arm shares
                self.gate_proj = nn.Linear(
                    cfg.d_model, cfg.n_heads * (cfg.head_dim if cfg.attn_gate == "elementwise" else 1), bias=False
                )
        self.sink_logits = nn.Parameter(torch.zeros(cfg.n_heads)) if cfg.attn_sink == "learned" else None
        self.dropout = cfg.dropout
        self.softcap = cfg.attn_softcap
        self.scores = ScoresTap(cfg.attn_softcap)
        self.tracks_max_logits = False

    def track_max_logits(self) -> None:
        """Keep each query head's largest pre-softmax logit (uncapped) of the forward passes since
        ``max_logits`` was last reset, for QK-clip (training/qk_clip.py). Costs one extra q k^T."""
        self.tracks_max_logits = True
        self.register_buffer(
            "max_logits",
            torch.full((self.n_heads,), float("-inf"), device=self.qkv_proj.weight.device),
            persistent=False,
        )

    def fused_rows(self) -> dict[str, list[tuple[str, int]]]:
        """The logical matrices stacked in the fused q|k|v weight, in row order (see SwiGLU.fused_rows)."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"qkv_proj.weight": [("q", q), ("k", kv), ("v", kv)]}

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the attention's input (and nothing else does)."""
        return [self.qkv_proj, *([self.gate_proj] if hasattr(self, "gate_proj") else [])]

    @property
    def has_qk_norm(self) -> bool:
        return hasattr(self, "q_norm")

    @property
    def normalizes_qk(self) -> bool:
        """Whether the scale of the q and k projections is normalized away (QK-norm or SimpleNorm)."""
        return self.has_qk_norm or hasattr(self, "q_proj_norm")

    def _heads(self, t: torch.Tensor, heads: int, norm: nn.Module | None = None) -> torch.Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim), normalized over the configured axis."""
        batch, seq, _ = t.shape
        if norm is not None and self.qk_axis == "all":
            t = norm(t)
        t = t.view(batch, seq, heads, self.head_dim)
        if norm is not None and self.qk_axis == "head":
            t = norm(t)
        return t.transpose(1, 2)

    def _project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k (rotated) and v as (batch, heads, seq, head_dim), each normalized where the model says."""
        qkv = self.qkv_proj(x)
        if not any(hasattr(self, f"{role}_norm") for role in ("q", "k", "v", "q_proj")):
            qk, v = self._heads(qkv, self.n_heads + 2 * self.n_kv_heads).split(
                [self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1
            )
            q, k = apply_rope(qk, cos, sin).split([self.n_heads, self.n_kv_heads], dim=1)  # q and k in one pass
            return q, k, v
        q, k, v = qkv.split([self.n_heads * self.head_dim, *(2 * [self.n_kv_heads * self.head_dim])], dim=-1)
        if hasattr(self, "q_proj_norm"):
            q, k, v = self.q_proj_norm(q), self.k_proj_norm(k), self.v_proj_norm(v)
        q = apply_rope(self._heads(q, self.n_heads, getattr(self, "q_norm", None)), cos, sin)
        k = apply_rope(self._heads(k, self.n_kv_heads, getattr(self, "k_norm", None)), cos, sin)
        return q, k, self._heads(v, self.n_kv_heads, getattr(self, "v_norm", None))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self._project(x, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, start_pos)

        self.scores(q, k, start_pos, self.sink_logits)
        if self.tracks_max_logits and self.training:
            with torch.no_grad():
                head_max = masked_scores(q, k, start_pos).amax(dim=(0, 2, 3))
                self.max_logits.copy_(torch.maximum(self.max_logits, head_max.to(self.max_logits.dtype)))
        if self.softcap is None and self.sink_logits is None:
            out = self._sdpa(q, k, v, start_pos)
        else:
            out = self._explicit_attention(q, k, v, start_pos)
        out = out.transpose(1, 2)  # (batch, seq, heads, head_dim)
        if hasattr(self, "gate_proj"):  # a gate per head broadcasts over its features
            out = out * torch.sigmoid(self.gate_proj(x)).view(batch, seq, self.n_heads, -1)
        out = self.o_proj(out.reshape(batch, seq, -1))
        return self.o_proj_norm(out) if hasattr(self, "o_proj_norm") else out

    def _sdpa(self, q, k, v, start_pos: int, scale: float | None = None) -> torch.Tensor:
        """SDPA, causal within the chunk and open to the cached past; ``scale`` None is 1/sqrt(d_head)."""
        seq = q.shape[2]
        mask, is_causal = None, seq > 1
        if start_pos > 0 and seq > 1:  # a chunk after cached tokens: causal within, full to the past
            mask = allowed_positions(seq, start_pos, q.device)
            is_causal = False
        # Grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads.
        dropout = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, dropout_p=dropout, enable_gqa=True, scale=scale
        )

    def _explicit_attention(self, q, k, v, start_pos: int) -> torch.Tensor:
        """softmax(softcap(q k^T / sqrt(d))) v with the sinks in the denominator, the scores formed explicitly
        (in float32 at least)."""
        weights = sink_softmax(masked_scores(q, k, start_pos, self.softcap), self.sink_logits)
        weights = F.dropout(weights, self.dropout if self.training else 0.0).to(v.dtype)
        return weights @ v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
