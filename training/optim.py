"""The optimizer (AdamW, or Muon for the blocks' matrices beside AdamW) and the warmup + cosine schedule.

``train.optimizer=adamw`` (the default): AdamW for every parameter, weight decay on matrices only.

``train.optimizer=muon``: ``torch.optim.Muon`` (Jordan et al. 2024) for the 2-D weight matrices of
the blocks, AdamW for everything else (embeddings, the LM head, norm gains and biases, scalars such
as DyT's alpha), both on the same schedule. A fused weight (q|k|v, gate|up) is orthogonalized per
logical matrix, as Muon's authors recommend: the optimizer sees each one as a view of the fused
weight's rows, so the model keeps its one matmul and its checkpoints. With ``adjust_lr_fn:
match_rms_adamw`` (Moonlight, Liu et al. 2025, arXiv 2502.16982) Muon's update has AdamW's RMS, so
AdamW's learning rates and weight decay carry over.

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

from training.adamw import adamw

WEIGHT_DECAY_MODES = ("coupled", "independent")
OPTIMIZERS = ("adamw", "muon")
MUON_LR_ADJUSTMENTS = ("match_rms_adamw", "original")
STATE_TENSORS = {torch.optim.AdamW: 2, torch.optim.Muon: 1}  # tensors of a parameter's size each keeps for it


def build_optimizer(model: nn.Module, train_cfg, device: torch.device):
    """AdamW for every parameter, or Muon for the blocks' matrices beside AdamW (``train.optimizer``,
    training/muon.py, imported only then)."""
    if train_cfg.optimizer == "muon":
        from training.muon import MuonWithAdamW

        return MuonWithAdamW(model, train_cfg, device)
    return adamw([(n, p) for n, p in model.named_parameters() if p.requires_grad], train_cfg, device)


def optimizer_groups(optimizer, model: nn.Module) -> dict[str, list[str]]:
    """Which optimizer got which parameters, by name (the run record's ``runtime.optimizer_groups``)."""
    groups = getattr(optimizer, "groups", None)  # an optimizer of several (Muon's) names its own
    return groups or {"adamw": [name for name, param in model.named_parameters() if param.requires_grad]}


def memory_per_rank(model: nn.Module, optimizer) -> dict[str, int]:
    """Bytes this process holds for parameters, gradients and optimizer moments (its shards under FSDP; DDP's buckets,
    one more copy of the gradients, left out): the run record's ``runtime.memory_per_rank``."""
    parts = getattr(optimizer, "parts", (optimizer,))  # train.optimizer=muon: Muon and AdamW
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
