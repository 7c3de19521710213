"""The optimizer, chosen by name (``train.optimizer``), and the warmup + cosine schedule.

``adamw`` (the default): AdamW for every parameter, weight decay on matrices only. Any other name in
``OPTIMIZERS`` is a variant's (variants/), imported only when chosen; it steps like one optimizer and may
name its parts (``parts``) and its parameter groups (``groups``).

Weight decay comes in two forms (``train.weight_decay_mode``), for both optimizers:

- ``coupled`` (torch's AdamW and Muon): theta <- theta - lr(t) * lambda * theta, so the decay scales
  with the learning rate and a learning-rate sweep also sweeps the decay;
- ``independent`` (Loshchilov & Hutter's original form; Wortsman et al. 2023):
  theta <- theta - lambda * s(t) * theta, with s(t) = lr(t) / lr the schedule's factor: the coupled
  form with decay lambda / lr.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from model.registry import resolve

WEIGHT_DECAY_MODES = ("coupled", "independent")
# train.optimizer -> the class, built as cls(model, train_cfg, device)
OPTIMIZERS = {"adamw": "training.step.adamw:adamw_for_model", "muon": "variants.muon:MuonWithAdamW"}
STATE_TENSORS = {torch.optim.AdamW: 2, torch.optim.Muon: 1}  # tensors of a parameter's size each keeps for it


def build_optimizer(model: nn.Module, train_cfg, device: torch.device):
    """The optimizer ``train.optimizer`` names, over the model's trainable parameters."""
    return resolve(OPTIMIZERS[train_cfg.optimizer])(model, train_cfg, device)


def optimizer_groups(optimizer, model: nn.Module) -> dict[str, list[str]]:
    """Which optimizer got which parameters, by name (the run record's ``runtime.optimizer_groups``)."""
    groups = getattr(optimizer, "groups", None)  # an optimizer of several names its own
    return groups or {"adamw": [name for name, param in model.named_parameters() if param.requires_grad]}


def memory_per_rank(model: nn.Module, optimizer) -> dict[str, int]:
    """Bytes this process holds for parameters, gradients and optimizer moments (its shards under FSDP; DDP's buckets,
    one more copy of the gradients, left out): the run record's ``runtime.memory_per_rank``."""
    parts = getattr(optimizer, "parts", (optimizer,))  # an optimizer of several: each of them
    moments = [(STATE_TENSORS[type(part)], p) for part in parts for group in part.param_groups for p in group["params"]]
    return {
        "param_bytes": sum(map(_held_bytes, model.parameters())),
        "grad_bytes": sum(_held_bytes(p) for p in model.parameters() if p.requires_grad),
        "optimizer_state_bytes": sum(count * _held_bytes(p) for count, p in moments),
    }


def _held_bytes(tensor: torch.Tensor) -> int:
    return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).nbytes  # a DTensor: this process's shard


def lr_at(step: int, train_cfg) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio``."""
    peak, floor = train_cfg.lr, train_cfg.lr * train_cfg.min_lr_ratio
    if step < train_cfg.warmup_steps:
        return peak * (step + 1) / train_cfg.warmup_steps
    decay_steps = max(1, train_cfg.max_steps - train_cfg.warmup_steps)
    progress = min(1.0, (step - train_cfg.warmup_steps) / decay_steps)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
