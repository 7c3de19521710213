"""Rotary position embeddings in the Hugging Face (rotate-half) layout.

The rotate-half layout pairs feature i with feature i + head_dim/2, which is what
``transformers``' Llama uses, so exported weights need no permutation.
"""

from __future__ import annotations

import math
from typing import Any

import torch

LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, scaling: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_seq_len, head_dim), in float32, with Llama 3's ``scaling`` if given."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    if scaling:
        inv_freq = llama3_frequencies(inv_freq, scaling)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def llama3_frequencies(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's longer context from a model trained on a shorter one: frequencies whose wavelength exceeds
    the original context / low_freq_factor are divided by ``factor``, those under context / high_freq_factor
    kept, and those between interpolated smoothly (Hugging Face's ``_compute_llama3_parameters``)."""
    if scaling.get("rope_type") != "llama3" or any(key not in scaling for key in LLAMA3_KEYS):
        raise ValueError(
            f"model.rope_scaling={scaling} is not Llama 3's: give rope_type llama3 and {', '.join(LLAMA3_KEYS)}"
        )
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    stretched = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    between = ~(wavelength < context / high) * ~(wavelength > context / low)
    return torch.where(between, (1 - smooth) * stretched / factor + smooth * stretched, stretched)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape (batch, heads, seq, head_dim) by the tables' rows for its positions."""
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)
