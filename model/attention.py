"""Causal grouped-query self-attention with a key/value cache for generation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # q, k and v from one matmul (rows [q | k | v]): one launch instead of three.
        self.qkv_proj = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, seq, self.n_heads + 2 * self.n_kv_heads, self.head_dim).transpose(1, 2)
        qk, v = qkv.split([self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = apply_rope(qk, cos, sin).split([self.n_heads, self.n_kv_heads], dim=1)  # q and k in one pass
        if cache is not None:
            k, v = cache.update(k, v, start_pos)

        mask, is_causal = None, seq > 1
        if start_pos > 0 and seq > 1:  # a chunk after cached tokens: causal within, full to the past
            mask = torch.ones(seq, start_pos + seq, dtype=torch.bool, device=x.device).tril(start_pos)
            is_causal = False
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
