"""Per-layer statistics: what each norm sees and emits, its gain, and per-layer gradient norms.

Activation statistics come from a separate probe forward pass every ``stats_every`` steps:
forward hooks on the norm modules (by their stable names) record the residual stream going
in and the normalized output coming out, under ``torch.no_grad`` and on the uncompiled
model, so the training steps in between carry no hooks and no cost. The same probe times
the norm layers against the whole forward pass.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
from torch import nn


def _rms_and_mean(x: torch.Tensor, prefix: str) -> dict[str, float]:
    x = x.detach().double()
    return {f"{prefix}_rms": x.pow(2).mean().sqrt().item(), f"{prefix}_mean": x.mean().item()}


def _moments(x: torch.Tensor, prefix: str) -> dict[str, float]:
    x = x.detach().double().flatten()
    centred = x - x.mean()
    var = centred.pow(2).mean()
    return {
        **_rms_and_mean(x, prefix),
        f"{prefix}_std": var.sqrt().item(),
        f"{prefix}_absmax": x.abs().max().item(),
        # Pearson kurtosis (3 for a Gaussian): large values flag outlier features.
        f"{prefix}_kurtosis": (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else 0.0,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def probe_norms(model: nn.Module, inputs: torch.Tensor, autocast: contextlib.AbstractContextManager) -> dict:
    """One eval-mode forward of ``inputs`` with hooks on every norm; returns ``act/`` and ``perf/`` metrics."""
    norms: dict[str, nn.Module] = model.norm_modules()
    metrics: dict[str, float] = {}
    norm_seconds: dict[str, float] = defaultdict(float)
    stats_seconds = [0.0]  # time spent computing the statistics, taken out of the forward time
    started: dict[str, float] = {}
    device = inputs.device

    def before(name):
        def hook(module, args, kwargs):
            _sync(device)
            started[name] = time.perf_counter()

        return hook

    def after(name):
        def hook(module, args, kwargs, output):
            _sync(device)
            stats_started = time.perf_counter()
            norm_seconds[name] += stats_started - started[name]
            # With a residual the norm returns (normalized, x + residual): the sum is the stream.
            stream, normalized = (output[1], output[0]) if isinstance(output, tuple) else (args[0], output)
            stats = {**_moments(stream, "in"), **_rms_and_mean(normalized, "out")}
            stats["gain_mean"] = module.weight.detach().float().mean().item()
            stats["gain_std"] = module.weight.detach().float().std().item()
            metrics.update({f"act/{name}/{key}": value for key, value in stats.items()})
            stats_seconds[0] += time.perf_counter() - stats_started

        return hook

    handles = []
    for name, module in norms.items():
        handles.append(module.register_forward_pre_hook(before(name), with_kwargs=True))
        handles.append(module.register_forward_hook(after(name), with_kwargs=True))
    was_training = model.training
    model.eval()
    try:
        _sync(device)
        begin = time.perf_counter()
        with autocast:
            model(inputs)
        _sync(device)
        total = time.perf_counter() - begin - stats_seconds[0]
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    metrics["perf/norm_forward_ms"] = 1000 * sum(norm_seconds.values())
    metrics["perf/norm_time_frac"] = sum(norm_seconds.values()) / total if total > 0 else 0.0
    return metrics


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each top-level part: ``grad/layers.3``, ``grad/tok_embeddings``, ..."""
    squares: dict[str, float] = defaultdict(float)
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        parts = name.split(".")
        group = ".".join(parts[:2]) if parts[0] == "layers" else parts[0]
        squares[group] += param.grad.detach().float().pow(2).sum().item()
    return {f"grad/{group}": value**0.5 for group, value in squares.items()}
