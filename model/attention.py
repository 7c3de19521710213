"""Causal grouped-query self-attention in SDPA, with optional norms on q, k and v, and a key/value cache.

    QK-norm   q and k normalized per head (Qwen3) or over all heads (OLMo 2), before RoPE; v too (QKV-norm)

Variants (variants/) plug into four slots, each a method a subclass overrides: ``project`` (x to rotated
q, k, v), ``attend`` (q, k, v to each head's output: SDPA, or the scores formed explicitly where a variant
changes them), ``mix_heads`` (the heads' outputs before the output projection) and ``project_out``.
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


def allowed_positions(seq: int, start_pos: int, device) -> torch.Tensor:
    """(seq, start_pos + seq), True where query i may attend key j: causal within, all of the cached past."""
    return torch.ones(seq, start_pos + seq, dtype=torch.bool, device=device).tril(start_pos)


def masked_scores(
    q: torch.Tensor, k: torch.Tensor, start_pos: int, cap: float | None = None, scale: float | None = None
) -> torch.Tensor:
    """The scores as the softmax receives them: q k^T * scale (1/sqrt(d) by default) in float32 at least,
    soft-capped when ``cap`` is set, -inf where a query may not attend (the explicit path, probes). The product
    itself runs in float32 at least: under bf16 autocast it would round the scores first."""
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
    """Where the attention scores are formed: a no-op that hands the rotated q and k (and the start position)
    to forward hooks.

    SDPA never materializes the scores; a probe or a hook that needs them (training/telemetry/probes/attention.py) hooks
    this module and forms them on its own with its attention's ``scores`` and ``softmax``, so training steps
    pay nothing.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, start_pos: int) -> None:
        return None


class Attention(nn.Module):
    """``normed``: the roles among q, k and v that a block's placement normalizes whatever the config says;
    the config adds q and k with ``qk_norm`` and v with ``v_norm``."""

    explicit_scores = False  # a variant that changes the scores or the softmax, which SDPA cannot, sets it
    score_scale: float | None = None  # the softmax scale; None: 1/sqrt(head_dim)

    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_size, kv_size = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        # q, k and v from one matmul (rows [q | k | v]): one launch instead of three.
        self.qkv_proj = nn.Linear(cfg.d_model, q_size + 2 * kv_size, bias=False)
        self.qk_axis = cfg.norm.qk_axis
        normed = {*normed, *(("q", "k") if cfg.norm.qk else ()), *(("v",) if cfg.norm.v else ())}
        per_head = cfg.norm.qk_axis == "head"
        for role, heads in (("q", cfg.n_heads), ("k", cfg.n_kv_heads), ("v", cfg.n_kv_heads)):
            if role in normed:
                setattr(self, f"{role}_norm", norm_for(cfg, role, cfg.head_dim if per_head else heads * cfg.head_dim))
        self.o_proj = nn.Linear(q_size, cfg.d_model, bias=False)
        self.dropout = cfg.dropout
        self.scores_tap = ScoresTap()

    @property
    def normed_roles(self) -> tuple[str, ...]:
        """Which of q, k and v this attention normalizes per head or over all heads (QK-norm, QKV-norm)."""
        return tuple(role for role in ("q", "k", "v") if hasattr(self, f"{role}_norm"))

    @property
    def normalizes_qk(self) -> bool:
        """Whether the scale of the q and k projections is normalized away."""
        return "q" in self.normed_roles

    def fused_rows(self) -> dict[str, list[tuple[str, int]]]:
        """The logical matrices stacked in the fused q|k|v weight, in row order (see SwiGLU.fused_rows)."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"qkv_proj.weight": [("q", q), ("k", kv), ("v", kv)]}

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the attention's input (and nothing else does)."""
        return [self.qkv_proj]

    def _heads(self, t: torch.Tensor, heads: int, norm: nn.Module | None = None) -> torch.Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim), normalized over the configured axis."""
        batch, seq, _ = t.shape
        if norm is not None and self.qk_axis == "all":
            t = norm(t)
        t = t.view(batch, seq, heads, self.head_dim)
        if norm is not None and self.qk_axis == "head":
            t = norm(t)
        return t.transpose(1, 2)

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The fused projection's output as q, k and v, each (batch, seq, heads * head_dim)."""
        return qkv.split([self.n_heads * self.head_dim, *(2 * [self.n_kv_heads * self.head_dim])], dim=-1)

    def rotate_heads(self, q, k, v, cos, sin) -> tuple[torch.Tensor, ...]:
        """q, k, v (batch, seq, features) split into heads, each normalized where configured, q and k rotated."""
        q = apply_rope(self._heads(q, self.n_heads, getattr(self, "q_norm", None)), cos, sin)
        k = apply_rope(self._heads(k, self.n_kv_heads, getattr(self, "k_norm", None)), cos, sin)
        return q, k, self._heads(v, self.n_kv_heads, getattr(self, "v_norm", None))

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Slot: q, k (rotated) and v as (batch, heads, seq, head_dim), each normalized where the model says."""
        qkv = self.qkv_proj(x)
        if self.normed_roles:
            return self.rotate_heads(*self.split_qkv(qkv), cos, sin)
        qk, v = self._heads(qkv, self.n_heads + 2 * self.n_kv_heads).split(
            [self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1
        )
        q, k = apply_rope(qk, cos, sin).split([self.n_heads, self.n_kv_heads], dim=1)  # q and k in one pass
        return q, k, v

    def scores(self, q: torch.Tensor, k: torch.Tensor, start_pos: int) -> torch.Tensor:
        """The scores as this attention's softmax receives them (float32 at least, -inf where masked)."""
        return masked_scores(q, k, start_pos, scale=self.score_scale)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """The attention weights from ``scores``."""
        return scores.softmax(dim=-1)

    def attend(self, q, k, v, start_pos: int) -> torch.Tensor:
        """Slot: each head's output (batch, heads, seq, head_dim): SDPA, or softmax(scores) v formed explicitly
        where a variant changes the scores or the softmax."""
        if not self.explicit_scores:
            return self._sdpa(q, k, v, start_pos, self.score_scale)
        weights = self.softmax(self.scores(q, k, start_pos))
        weights = F.dropout(weights, self.dropout if self.training else 0.0).to(v.dtype)
        return weights @ v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)

    def mix_heads(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Slot: the heads' outputs (batch, seq, heads, head_dim) before the output projection; ``x`` the input."""
        return out

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        """Slot: the output projection of the heads' outputs, (batch, seq, heads * head_dim)."""
        return self.o_proj(out)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, start_pos)
        self.scores_tap(q, k, start_pos)
        out = self.mix_heads(self.attend(q, k, v, start_pos).transpose(1, 2), x)  # (batch, seq, heads, head_dim)
        return self.project_out(out.reshape(batch, seq, -1))

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
