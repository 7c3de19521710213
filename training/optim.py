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
from typing import Any

import torch
from torch import nn

from model.matrices import logical_matrices

WEIGHT_DECAY_MODES = ("coupled", "independent")
OPTIMIZERS = ("adamw", "muon")
MUON_LR_ADJUSTMENTS = ("match_rms_adamw", "original")


def coupled_weight_decay(train_cfg, weight_decay: float | None = None) -> float:
    """The decay a coupled optimizer is given so that it applies ``weight_decay`` (default
    ``train.weight_decay``) in the configured mode."""
    decay = train_cfg.weight_decay if weight_decay is None else weight_decay
    return decay / train_cfg.lr if train_cfg.weight_decay_mode == "independent" else decay


def block_matrices(model: nn.Module) -> list[tuple[str, nn.Parameter, slice]]:
    """The blocks' 2-D weights as Muon should see them: (name, the parameter, its rows), a fused weight
    once per logical matrix (``layers.0.attn.qkv_proj.weight[q]``)."""
    return [m for m in logical_matrices(model) if m[0].startswith("layers.") and m[1].requires_grad]


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


class MuonWithAdamW:
    """torch.optim.Muon for the blocks' matrices, each logical matrix on its own, and AdamW for the rest:
    one optimizer to the training loop (``param_groups``, ``step``, ``zero_grad``, a state dict of both)."""

    def __init__(self, model: nn.Module, train_cfg, device: torch.device) -> None:
        matrices = block_matrices(model)
        # Each logical matrix is a Parameter that views its rows of the model's weight: Muon updates
        # the weight in place, and its gradient is the same rows of the weight's gradient.
        self.views = [(nn.Parameter(param.detach()[rows]), param, rows) for _, param, rows in matrices]
        muon = train_cfg.muon
        self.muon = torch.optim.Muon(
            [view for view, _, _ in self.views],
            lr=train_cfg.lr,
            weight_decay=coupled_weight_decay(train_cfg, muon.weight_decay),
            momentum=muon.momentum,
            nesterov=muon.nesterov,
            ns_steps=muon.ns_steps,
            adjust_lr_fn=str(muon.adjust_lr_fn),
        )
        taken = {id(param) for _, param, _ in matrices}
        rest = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in taken]
        self.adamw = adamw(rest, train_cfg, device)
        self.groups = {"muon": [name for name, _, _ in matrices], "adamw": [name for name, _ in rest]}

    @property
    def param_groups(self) -> list[dict]:
        return self.muon.param_groups + self.adamw.param_groups

    @torch.no_grad()
    def step(self) -> None:
        for view, param, rows in self.views:
            view.grad = None if param.grad is None else param.grad[rows]
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every gradient, the model's fused weights' too: the views are Muon's parameters, not the weights."""
        for view, param, _ in self.views:
            view.grad = None
            if param.grad is not None:
                if set_to_none:
                    param.grad = None
                else:
                    param.grad.zero_()
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def build_optimizer(model: nn.Module, train_cfg, device: torch.device):
    """AdamW for every parameter, or Muon for the blocks' matrices beside AdamW (``train.optimizer``)."""
    if train_cfg.optimizer == "muon":
        return MuonWithAdamW(model, train_cfg, device)
    return adamw([(n, p) for n, p in model.named_parameters() if p.requires_grad], train_cfg, device)


def optimizer_groups(optimizer, model: nn.Module) -> dict[str, list[str]]:
    """Which optimizer got which parameters, by name (the run record's ``runtime.optimizer_groups``)."""
    if isinstance(optimizer, MuonWithAdamW):
        return optimizer.groups
    return {"adamw": [name for name, param in model.named_parameters() if param.requires_grad]}


def lr_at(step: int, train_cfg) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``lr * min_lr_ratio``."""
    peak, floor = train_cfg.lr, train_cfg.lr * train_cfg.min_lr_ratio
    if step < train_cfg.warmup_steps:
        return peak * (step + 1) / train_cfg.warmup_steps
    decay_steps = max(1, train_cfg.max_steps - train_cfg.warmup_steps)
    progress = min(1.0, (step - train_cfg.warmup_steps) / decay_steps)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))
