"""Gradient norms by part of the model, read on a training step (before the optimizer step)."""

from __future__ import annotations

from collections import defaultdict

from torch import nn

GRADIENT_KEYS = ("grad/{part}",)  # part: layers.<i>, tok_embeddings, final_norm, lm_head (when untied)


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each top-level part: ``grad/layers.3``, ``grad/tok_embeddings``, ..."""
    squares: dict[str, float] = defaultdict(float)
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        parts = name.split(".")
        group = ".".join(parts[:2]) if parts[0] == "layers" else parts[0]
        square = param.grad.detach().float().pow(2).sum()  # under FSDP a DTensor, whose full value sums the shards
        squares[group] += (square.full_tensor() if hasattr(square, "full_tensor") else square).item()
    return {f"grad/{group}": value**0.5 for group, value in squares.items()}
