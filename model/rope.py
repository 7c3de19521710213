"""Rotary position embeddings in the Hugging Face (rotate-half) layout.

The rotate-half layout pairs feature i with feature i + head_dim/2, which is what
``transformers``' Llama uses, so exported weights need no permutation.
"""

from __future__ import annotations

import torch


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_seq_len, head_dim), in float32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape (batch, heads, seq, head_dim) by the tables' rows for its positions."""
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)
