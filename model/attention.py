"""Causal grouped-query self-attention with optional QK-norm, score soft-cap, and a key/value cache.

Uncapped attention runs in SDPA (fused, the scores never materialized). A soft-cap on the scores
(Gemma 2: ``c * tanh(s / c)``) is something SDPA cannot apply, so a capped model takes an
explicit path that forms the scores; ``scripts/bench_variants.py`` measures what that costs.
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
    soft-capped when ``cap`` is set, -inf where a query may not attend (the explicit path, QK-clip's maxima,
    probes)."""
    scores = attention_scores(q, k, scale)
    scores = softcap(scores.to(torch.promote_types(scores.dtype, torch.float32)), cap)
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
    (None: 1/sqrt(d_head)), for probes to apply.
    """

    def __init__(self, softcap: float | None, scale: float | None = None) -> None:
        super().__init__()
        self.softcap, self.scale = softcap, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, start_pos: int) -> None:
        return None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # q, k and v from one matmul (rows [q | k | v]): one launch instead of three.
        self.qkv_proj = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.qk_axis = cfg.qk_axis
        if cfg.qk_norm is not None:
            per_head = cfg.qk_axis == "head"
            self.q_norm = norm_for(cfg, "q", cfg.head_dim if per_head else cfg.n_heads * cfg.head_dim)
            self.k_norm = norm_for(cfg, "k", cfg.head_dim if per_head else cfg.n_kv_heads * cfg.head_dim)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
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

    @property
    def has_qk_norm(self) -> bool:
        return hasattr(self, "q_norm")

    def _heads(self, t: torch.Tensor, heads: int, norm: nn.Module | None = None) -> torch.Tensor:
        """(batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim), QK-normed over the configured axis."""
        batch, seq, _ = t.shape
        if norm is not None and self.qk_axis == "all":
            t = norm(t)
        t = t.view(batch, seq, heads, self.head_dim)
        if norm is not None and self.qk_axis == "head":
            t = norm(t)
        return t.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv_proj(x)
        if self.has_qk_norm:  # q and k normalized (per head or over all heads), then rotated
            q, k, v = qkv.split([self.n_heads * self.head_dim, *(2 * [self.n_kv_heads * self.head_dim])], dim=-1)
            q = apply_rope(self._heads(q, self.n_heads, self.q_norm), cos, sin)
            k = apply_rope(self._heads(k, self.n_kv_heads, self.k_norm), cos, sin)
            v = self._heads(v, self.n_kv_heads)
        else:
            qk, v = self._heads(qkv, self.n_heads + 2 * self.n_kv_heads).split(
                [self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1
            )
            q, k = apply_rope(qk, cos, sin).split([self.n_heads, self.n_kv_heads], dim=1)  # q and k in one pass
        if cache is not None:
            k, v = cache.update(k, v, start_pos)

        self.scores(q, k, start_pos)
        if self.tracks_max_logits and self.training:
            with torch.no_grad():
                head_max = masked_scores(q, k, start_pos).amax(dim=(0, 2, 3))
                self.max_logits.copy_(torch.maximum(self.max_logits, head_max.to(self.max_logits.dtype)))
        out = self._sdpa(q, k, v, start_pos) if self.softcap is None else self._capped_attention(q, k, v, start_pos)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))

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

    def _capped_attention(self, q, k, v, start_pos: int) -> torch.Tensor:
        """softmax(softcap(q k^T / sqrt(d))) v, with the scores formed explicitly (in float32 at least)."""
        scores = masked_scores(q, k, start_pos, self.softcap)
        weights = F.dropout(scores.softmax(dim=-1), self.dropout if self.training else 0.0).to(v.dtype)
        return weights @ v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
