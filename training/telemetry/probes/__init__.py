"""The probe pass: statistics of a model's activations on a batch of its own, every ``train.stats_every`` steps.

Each probe (one class, one file) attaches forward hooks, collects its values and declares the
keys it writes. The pass runs in eval mode, under ``torch.no_grad``, eagerly (FSDP compiles blocks in
place), so the training steps in between carry no hooks and no cost. A run chooses its probes by config,
``train.probes``: the core's below by name, any other (the studies', lab/study_probes/, or one of
your own) by its import path ``package.module:Class``. Each is imported only when chosen.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from model.registry import resolve
from training.step.post_step import OPTION_HOOKS
from training.telemetry.probes.base import Probe, sync
from training.telemetry.probes.gradients import GRADIENT_KEYS

# The core's probes: what each norm sees and emits, the residual stream, attention logits, output logits.
PROBES = {
    "norm_io": "training.telemetry.probes.norm_io:NormInputOutput",
    "stream": "training.telemetry.probes.stream:ResidualStream",
    "attention": "training.telemetry.probes.attention:AttentionLogits",
    "logits": "training.telemetry.probes.logits:OutputLogits",
}

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


def resolve_probe(name: str) -> type[Probe]:
    """The probe class a ``train.probes`` entry names: a core probe's name, or ``package.module:Class``."""
    path = PROBES.get(name, name)
    if not path.partition(":")[2]:
        raise ValueError(
            f"train.probes: {name!r} is neither a core probe ({', '.join(PROBES)}) nor a path package.module:Class"
        )
    try:
        probe = resolve(path)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"train.probes: {name!r} cannot be imported ({err})") from None
    if not (isinstance(probe, type) and issubclass(probe, Probe)):
        raise ValueError(f"train.probes: {name!r} is not a probe (a subclass of training.telemetry.probes.base.Probe)")
    return probe


def declared_keys() -> tuple[str, ...]:
    """Every key template that the core writes: the loop's, the gradients', each core probe's and each post-step
    hook's (training/step/post_step.py)."""
    probe_keys = tuple(key for name in PROBES for key in resolve_probe(name).keys)
    return (
        LOOP_KEYS
        + GRADIENT_KEYS
        + probe_keys
        + tuple(key for path in OPTION_HOOKS.values() for key in resolve(path).keys)
    )


@torch.no_grad()
def run_probes(
    model: nn.Module, inputs: torch.Tensor, autocast: contextlib.AbstractContextManager, probe_types
) -> dict:
    """One eval-mode forward of ``inputs`` with each probe of ``probe_types`` attached; returns their metrics."""
    probes = [probe() for probe in sorted(probe_types, key=lambda probe: probe.attach_order)]
    was_training = model.training
    model.eval()
    try:
        for probe in probes:
            probe.attach(model)
        sync(inputs.device)
        started = time.perf_counter()
        with autocast, torch.compiler.set_stance("force_eager"):  # eager even where modules are compiled in place
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
