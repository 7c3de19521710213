"""The probe pass: statistics of a model's activations on a batch of its own, every ``train.stats_every`` steps.

Each probe (one class, one file) attaches forward hooks, collects its values and declares the
keys it writes. The pass runs in eval mode, under ``torch.no_grad``, on the uncompiled model,
so the training steps in between carry no hooks and no cost. Adding a metric is adding a
probe class to ``PROBES``.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from training.probes.attention import AttentionLogits
from training.probes.attention_sinks import AttentionSinks
from training.probes.base import Probe, feature_kurtosis, sync
from training.probes.gradients import GRADIENT_KEYS, layer_grad_norms
from training.probes.layer_importance import LayerImportance
from training.probes.logits import OutputLogits
from training.probes.massive import MassiveActivations
from training.probes.ngpt import NGPTScales
from training.probes.norm_io import NormInputOutput
from training.probes.stream import ResidualStream
from training.probes.timing import NormTime

# NormTime first: its hooks then run before any other probe's on the same module.
PROBES: tuple[type[Probe], ...] = (
    NormTime,
    NormInputOutput,
    ResidualStream,
    LayerImportance,
    MassiveActivations,
    AttentionLogits,
    AttentionSinks,
    OutputLogits,
    NGPTScales,
)

# Keys the training loop and the evaluation write themselves.
LOOP_KEYS = (
    "step",
    "diverged",
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "train/tokens",
    "train/last_finite_loss",
    "train/z_loss",  # coefficient included; train/loss stays the cross-entropy
    "train/qk_clipped_heads",  # heads whose projections QK-clip rescaled after this step
    "val/loss",
    "val/ppl",
    "val/bpb",
    "heldout/loss",  # data.heldout_windows: windows disjoint from val/'s
    "heldout/ppl",
    "heldout/bpb",
    "perf/tokens_per_sec",
    "perf/mfu",
    "perf/peak_mem_gb",
    "perf/elapsed_s",
)


def declared_keys() -> tuple[str, ...]:
    """Every key template that training writes: the loop's, the gradients', and each probe's."""
    return LOOP_KEYS + GRADIENT_KEYS + tuple(key for probe in PROBES for key in probe.keys)


@torch.no_grad()
def run_probes(model: nn.Module, inputs: torch.Tensor, autocast: contextlib.AbstractContextManager) -> dict:
    """One eval-mode forward of ``inputs`` with every probe attached; returns their metrics."""
    probes = [probe() for probe in PROBES]
    was_training = model.training
    model.eval()
    try:
        for probe in probes:
            probe.attach(model)
        sync(inputs.device)
        started = time.perf_counter()
        with autocast:
            model(inputs)
        sync(inputs.device)
        forward_seconds = time.perf_counter() - started - sum(probe.hook_seconds for probe in probes)
        metrics: dict[str, float] = {}
        for probe in probes:
            metrics.update(probe.collect(forward_seconds))
        return metrics
    finally:
        model.train(was_training)
        for probe in probes:
            probe.detach()


__all__ = ["PROBES", "LOOP_KEYS", "Probe", "declared_keys", "feature_kurtosis", "layer_grad_norms", "run_probes"]
