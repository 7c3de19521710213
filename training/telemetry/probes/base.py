"""What a probe is: hooks attached for one forward pass, the values they collected, the keys they write.

A probe declares the key templates it writes (``act/{norm}/in_rms``, ``act/layers.{i}/stream_rms``):
readers (lab/, the explorer, reports) ask for keys by these templates, and asking for one
that no probe declares fails (``lab.keys``), so a renamed key breaks a test instead of
emptying a plot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn


class Probe:
    """Attach hooks to a model, run one forward pass (``training.telemetry.probes.run_probes``), collect.

    Hooks registered with ``hook`` time themselves: the pass takes that time out of the forward
    time it reports, so statistics do not inflate timings.
    """

    keys: ClassVar[tuple[str, ...]] = ()
    attach_order: ClassVar[int] = 0  # lower attaches first, so its hooks on a module run before the others'

    def __init__(self) -> None:
        self.handles: list = []
        self.hook_seconds = 0.0
        self.values: dict[str, float] = {}

    def attach(self, model: nn.Module) -> None:
        raise NotImplementedError

    def collect(self, forward_seconds: float) -> dict[str, float]:
        """The values gathered during the pass (``forward_seconds``: the pass's forward time without hooks)."""
        return self.values

    def hook(self, module: nn.Module, fn: Callable, timed: bool = True) -> None:
        """``fn(module, args, output)`` after ``module``'s forward; its time counted as probe overhead if ``timed``."""

        def wrapped(module, args, output):
            started = time.perf_counter()
            fn(module, args, output)
            if timed:
                self.hook_seconds += time.perf_counter() - started

        self.handles.append(module.register_forward_hook(wrapped))

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def rms_and_mean(x: torch.Tensor) -> tuple[float, float]:
    x = x.detach().double()
    return x.pow(2).mean().sqrt().item(), x.mean().item()


def kurtosis(x: torch.Tensor) -> float:
    """Pearson kurtosis (3 for a Gaussian) of the values of ``x``."""
    centred = x - x.mean()
    var = centred.pow(2).mean()
    return (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else 0.0


def feature_kurtosis(x: torch.Tensor) -> float:
    """Kurtosis of the per-feature RMS over all tokens (He et al. 2024, arXiv 2405.19279).

    About 3 when no feature stands out; large when a few features carry outsized values
    (outlier features), which element kurtosis can miss.
    """
    rows = x.detach().double().reshape(-1, x.shape[-1])
    return kurtosis(rows.pow(2).mean(dim=0).sqrt())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
