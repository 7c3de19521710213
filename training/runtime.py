"""Device, precision and seeding: the few decisions every entry point makes the same way."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` picks cuda, then mps, then cpu; under torchrun each process takes its local GPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name} but CUDA is not available here; use device=auto or device=cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"train.precision must be auto, fp32 or bf16, got {precision!r}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast (weights and optimizer stay float32), or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
