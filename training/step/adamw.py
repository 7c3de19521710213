"""AdamW as normlab configures it: decay on matrices only, in the configured form (training/step/optim.py says which)."""

from __future__ import annotations

import torch
from torch import nn


def coupled_weight_decay(train_cfg, weight_decay: float | None = None) -> float:
    """The decay a coupled optimizer is given so that it applies ``weight_decay`` (default
    ``train.weight_decay``) in the configured mode."""
    decay = train_cfg.weight_decay if weight_decay is None else weight_decay
    return decay / train_cfg.lr if train_cfg.weight_decay_mode == "independent" else decay


def adamw_groups(named: list[tuple[str, nn.Parameter]], train_cfg) -> list[dict]:
    """AdamW's two groups: matrices decayed, norm gains, biases, scalars and embeddings not (unless
    ``train.decay_norms_and_embeddings``)."""
    decay, no_decay = [], []
    for name, param in named:
        is_matrix = param.dim() >= 2 and "embeddings" not in name
        (decay if is_matrix or train_cfg.decay_norms_and_embeddings else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": coupled_weight_decay(train_cfg)},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def adamw(named: list[tuple[str, nn.Parameter]], train_cfg, device: torch.device) -> torch.optim.AdamW:
    fused = device.type == "cuda"  # the fused implementation is fastest on CUDA; foreach elsewhere
    return torch.optim.AdamW(
        adamw_groups(named, train_cfg),
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
        fused=fused,
        foreach=not fused,
    )


def adamw_for_model(model: nn.Module, train_cfg, device: torch.device) -> torch.optim.AdamW:
    """AdamW for every trainable parameter of ``model`` (train.optimizer=adamw)."""
    return adamw([(n, p) for n, p in model.named_parameters() if p.requires_grad], train_cfg, device)
