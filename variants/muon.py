"""Muon for the blocks' matrices beside AdamW for the rest (``train.optimizer=muon``; training/step/optim.py).

``torch.optim.Muon`` (Jordan et al. 2024) orthogonalizes each update. A fused weight (q|k|v, gate|up) is
orthogonalized per logical matrix, as Muon's authors recommend: the optimizer sees each one as a view of
the fused weight's rows, so the model keeps its one matmul and its checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from model.matrices import logical_matrices
from training.step.adamw import adamw, coupled_weight_decay


def block_matrices(model: nn.Module) -> list[tuple[str, nn.Parameter, slice]]:
    """The blocks' 2-D weights as Muon should see them: (name, the parameter, its rows), a fused weight
    once per logical matrix (``layers.0.attn.qkv_proj.weight[q]``)."""
    return [m for m in logical_matrices(model) if m[0].startswith("layers.") and m[1].requires_grad]


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
    def parts(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        return self.muon, self.adamw

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
