"""Causal grouped-query self-attention with optional QK-norm and a key/value cache for generation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.norm_roles import norm_for
from model.rope import apply_rope


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
    """

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
        self.scores = ScoresTap()

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

        mask, is_causal = None, seq > 1
        if start_pos > 0 and seq > 1:  # a chunk after cached tokens: causal within, full to the past
            mask = torch.ones(seq, start_pos + seq, dtype=torch.bool, device=x.device).tril(start_pos)
            is_causal = False
        self.scores(q, k, start_pos)
        # Grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads.
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=True,
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))
