"""Massive activations (Sun et al. 2024, arXiv 2402.17762): a few features at a few positions of the
residual stream, orders of magnitude above the rest, acting as fixed biases.

For the stream leaving each block: the largest |h| over the median |h| (about 4-5 for a Gaussian,
in the thousands for a massive activation), and the position, feature and token where that largest
value sits (the paper finds them on the first token and on the first "." or newline).
"""

from __future__ import annotations

import torch
from torch import nn

from training.telemetry.probes.base import Probe


@torch.no_grad()
def massive_stats(h: torch.Tensor, tokens: torch.Tensor) -> dict[str, float]:
    """``ratio`` = max |h| / median |h|, and the ``position`` (index in the sequence), ``feature`` and
    ``token`` (the id in ``tokens`` there) of the max, for h of shape (batch, seq, features) computed from
    ``tokens`` (batch, seq)."""
    magnitude = h.detach().abs().float()
    flat_index = int(magnitude.argmax())
    row, position, feature = torch.unravel_index(torch.tensor(flat_index), magnitude.shape)
    median = magnitude.median().item()
    peak = magnitude.flatten()[flat_index].item()
    return {
        "ratio": peak / median if median > 0 else float("inf"),
        "position": int(position),
        "feature": int(feature),
        "token": int(tokens[row, position]),
    }


class MassiveActivations(Probe):
    keys = (
        "act/layers.{i}/massive_ratio",
        "act/layers.{i}/massive_position",
        "act/layers.{i}/massive_feature",
        "act/layers.{i}/massive_token",  # the token id: eval.json's token_text holds its text
    )

    def attach(self, model: nn.Module) -> None:
        self.hook(model.tok_embeddings, self._remember_tokens)  # the pass's token ids, before any block runs
        for index, layer in enumerate(model.layers):
            self.hook(layer, self._measure(index))

    def _remember_tokens(self, module, args, output) -> None:
        self.tokens = args[0]

    def _measure(self, index: int):
        def measure(module, args, output) -> None:
            for key, value in massive_stats(output, self.tokens).items():
                self.values[f"act/layers.{index}/massive_{key}"] = value

        return measure
