"""The validation metrics shared by train.py and eval.py."""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module,
    windows: torch.Tensor,
    token_bytes: torch.Tensor,
    batch_size: int,
    device: torch.device,
    autocast: contextlib.AbstractContextManager,
    prefix: str = "val",
) -> dict[str, float]:
    """Loss (nats/token), perplexity and bits per byte over fixed validation windows.

    Bits per byte divides the summed loss by the UTF-8 bytes the target tokens stand for, so
    runs with different tokenizers compare on the same footing.
    """
    was_training = model.training
    model.eval()
    total_nats, total_tokens, total_bytes = 0.0, 0, 0.0
    try:
        for chunk in windows.split(batch_size):
            chunk = chunk.to(device)
            inputs, targets = chunk[:, :-1], chunk[:, 1:]
            with autocast:  # no float32 logits for the whole batch (model/loss.py summed_cross_entropy)
                total_nats += model(inputs, targets, summed=True).item()
            total_tokens += targets.numel()
            total_bytes += token_bytes[targets.cpu()].sum().item()
    finally:
        model.train(was_training)
    loss = total_nats / total_tokens
    return {
        f"{prefix}/loss": loss,
        f"{prefix}/ppl": math.exp(min(loss, 700.0)),
        f"{prefix}/bpb": total_nats / math.log(2) / max(total_bytes, 1.0),
    }
