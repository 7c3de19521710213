"""AdamW with weight decay on matrices only, and the warmup + cosine learning-rate schedule.

Weight decay comes in two forms (``train.weight_decay_mode``):

- ``coupled`` (torch's AdamW): theta <- theta - lr(t) * lambda * theta, so the decay scales with
  the learning rate and a learning-rate sweep also sweeps the decay;
- ``independent`` (Loshchilov & Hutter's original form; Wortsman et al. 2023):
  theta <- theta - lambda * s(t) * theta, with s(t) = lr(t) / lr the schedule's factor. It is
  AdamW with decay lambda / lr: lr(t) * lambda / lr = lambda * s(t), applied at the same point of
  the step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

WEIGHT_DECAY_MODES = ("coupled", "independent")


def adamw_weight_decay(train_cfg) -> float:
    """The decay AdamW is given so that it applies ``train.weight_decay`` in the configured mode."""
    if train_cfg.weight_decay_mode == "independent":
        return train_cfg.weight_decay / train_cfg.lr
    return train_cfg.weight_decay


def build_optimizer(model: nn.Module, train_cfg, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay applies to matrices (linear weights), not to norm gains and biases.

    Embeddings are matrices too, but by default they are left undecayed like the norms
    (``train.decay_norms_and_embeddings=true`` decays everything).
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_matrix = param.dim() >= 2 and "embeddings" not in name
        (decay if is_matrix or train_cfg.decay_norms_and_embeddings else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": adamw_weight_decay(train_cfg)},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused implementation is fastest on CUDA; foreach elsewhere.
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2), fused=fused, foreach=not fused
    )


def lr_at(step: int, train_cfg) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio``."""
    peak, floor = train_cfg.lr, train_cfg.lr * train_cfg.min_lr_ratio
    if step < train_cfg.warmup_steps:
        return peak * (step + 1) / train_cfg.warmup_steps
    decay_steps = max(1, train_cfg.max_steps - train_cfg.warmup_steps)
    progress = min(1.0, (step - train_cfg.warmup_steps) / decay_steps)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
