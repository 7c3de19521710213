"""nGPT's learned scales and its hidden state: the eigen learning rates alpha_A and alpha_M, s_qk and s_z,
and the norm of the state leaving each block, which nGPT keeps at 1 (this probe checks it).

Written only for an nGPT model (norm=ngpt); every other model has none of these.
"""

from __future__ import annotations

import torch
from torch import nn

from training.telemetry.probes.base import Probe
from variants.ngpt import NGPTBlock


def mean_and_std(vector: torch.Tensor) -> tuple[float, float]:
    values = vector.detach().double()
    return values.mean().item(), values.std(unbiased=False).item()


class NGPTScales(Probe):
    keys = (
        "act/layers.{i}/alpha_attn_mean",
        "act/layers.{i}/alpha_attn_std",
        "act/layers.{i}/alpha_mlp_mean",
        "act/layers.{i}/alpha_mlp_std",
        "attn/layers.{i}/s_qk_mean",
        "attn/layers.{i}/s_qk_std",
        "logits/s_z_mean",
        "logits/s_z_std",
        "act/layers.{i}/stream_norm",
    )

    def attach(self, model: nn.Module) -> None:
        if getattr(model, "logit_scale", None) is None:
            return
        self._put("logits/s_z", model.logit_scale())
        for index, layer in enumerate(model.layers):
            if not isinstance(layer, NGPTBlock):
                continue
            self._put(f"act/layers.{index}/alpha_attn", layer.attn_alpha().abs())  # as the block uses them
            self._put(f"act/layers.{index}/alpha_mlp", layer.mlp_alpha().abs())
            self._put(f"attn/layers.{index}/s_qk", torch.cat([layer.attn.s_q(), layer.attn.s_k()]))
            self.hook(layer, self._stream_norm(index))

    def _put(self, prefix: str, vector: torch.Tensor) -> None:
        self.values[f"{prefix}_mean"], self.values[f"{prefix}_std"] = mean_and_std(vector)

    def _stream_norm(self, index: int):
        def measure(module, args, output) -> None:
            self.values[f"act/layers.{index}/stream_norm"] = output.detach().double().norm(dim=-1).mean().item()

        return measure
