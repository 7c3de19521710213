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


PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision must be auto, fp32 or bf16, got {precision!r}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return str(precision)


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast (weights and optimizer stay float32), or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# On CPU, torch.compile made training steps 7.0% faster (scripts/bench_train.py --compile: 11,197 vs
# 10,467 tokens/s on the default model, Intel Xeon, 2 cores) after 15-40 s of compilation; it pays
# back after 1,200 to 3,000 steps, so `train.compile: null` compiles CPU runs from this length on.
CPU_COMPILE_MIN_STEPS = 5000


def should_compile(setting: bool | None, device: torch.device, max_steps: int) -> bool:
    """train.compile, or when null: always on CUDA, and on CPU for runs long enough to pay the compile back."""
    if setting is not None:
        return setting
    return device.type == "cuda" or (device.type == "cpu" and max_steps >= CPU_COMPILE_MIN_STEPS)
