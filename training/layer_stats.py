"""Per-layer statistics: what each norm sees and emits, the residual stream, attention, gradients.

Activation statistics come from a separate probe forward pass every ``stats_every`` steps (and
at the last step): forward hooks on every norm module (found by type, so the statistics are
right in every placement), on every block's output (the residual stream) and on attention,
under ``torch.no_grad`` and on the uncompiled model, so the training steps in between carry
no hooks and no cost. The same probe times the norm layers against the whole forward pass.

Keys: ``act/<norm>/in_*`` describe what the norm sees (the residual stream for a norm before a
branch, the branch output for one after it, q or k for QK-norm; the norm's role is in the run's
``runtime.norm_roles``), ``act/<norm>/out_*`` what it emits; ``act/layers.<i>/stream_*`` the
residual stream leaving block i; ``attn/layers.<i>/max_logit`` and ``entropy`` the attention.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch
from torch import nn

from model.attention import Attention


def _rms_and_mean(x: torch.Tensor, prefix: str) -> dict[str, float]:
    x = x.detach().double()
    return {f"{prefix}_rms": x.pow(2).mean().sqrt().item(), f"{prefix}_mean": x.mean().item()}


def _kurtosis(x: torch.Tensor) -> float:
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
    return _kurtosis(rows.pow(2).mean(dim=0).sqrt())


def _moments(x: torch.Tensor, prefix: str) -> dict[str, float]:
    flat = x.detach().double().flatten()
    return {
        **_rms_and_mean(flat, prefix),
        f"{prefix}_std": flat.std(correction=0).item(),
        f"{prefix}_absmax": flat.abs().max().item(),
        # Large values flag outlier elements; the feature kurtosis flags outlier features.
        f"{prefix}_kurtosis": _kurtosis(flat),
        f"{prefix}_feature_kurtosis": feature_kurtosis(x),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def probe_norms(model: nn.Module, inputs: torch.Tensor, autocast: contextlib.AbstractContextManager) -> dict:
    """One eval-mode forward of ``inputs`` with hooks on every norm; returns ``act/``, ``attn/`` and ``perf/`` metrics."""
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
            # With a residual the norm returns (normalized, x + residual): it sees the sum.
            seen, normalized = (output[1], output[0]) if isinstance(output, tuple) else (args[0], output)
            stats = {**_moments(seen, "in"), **_rms_and_mean(normalized, "out")}
            gain = module.effective_gain()
            if gain is not None:
                stats.update(gain_mean=gain.mean().item(), gain_std=gain.std().item())
            if hasattr(module, "saturated_fraction"):  # DyT, Derf: inputs in the flat part of the squash
                stats["saturated"] = module.saturated_fraction(seen)
            metrics.update({f"act/{name}/{key}": value for key, value in stats.items()})
            stats_seconds[0] += time.perf_counter() - stats_started

        return hook

    def stream(index):
        def hook(module, args, output):
            started_stats = time.perf_counter()
            stats = {
                "stream_rms": _rms_and_mean(output, "x")["x_rms"],
                "stream_feature_kurtosis": feature_kurtosis(output),
            }
            metrics.update({f"act/layers.{index}/{key}": value for key, value in stats.items()})
            stats_seconds[0] += time.perf_counter() - started_stats

        return hook

    handles = []
    for name, module in norms.items():
        handles.append(module.register_forward_pre_hook(before(name), with_kwargs=True))
        handles.append(module.register_forward_hook(after(name), with_kwargs=True))
    for index, layer in enumerate(model.layers):
        handles.append(layer.register_forward_hook(stream(index)))
    attention = {name: m for name, m in model.named_modules() if isinstance(m, Attention)}
    was_training = model.training
    model.eval()
    try:
        for module in attention.values():
            module.stats = {}
        _sync(device)
        begin = time.perf_counter()
        with autocast:
            model(inputs)
        _sync(device)
        total = time.perf_counter() - begin - stats_seconds[0]
        for name, module in attention.items():
            layer = name.removesuffix(".attn")
            metrics.update({f"attn/{layer}/{key}": value for key, value in module.stats.items()})
    finally:
        model.train(was_training)
        for module in attention.values():
            module.stats = None
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
