"""Fake quantization of the blocks' linear layers: what a norm choice costs a user who quantizes.

Every ``nn.Linear`` inside the blocks (attention's qkv and output projections, the MLP's
projections) gets its weights rounded to the scheme's grid and, where the scheme quantizes
activations, its inputs rounded on the way in; the arithmetic stays in float. That is the
error of the integer kernels without the kernels. The embeddings and the LM head stay in float.

    w4a16        weights int4, per output channel, symmetric, round to nearest (scale = max|row| / 7)
    w8a8         weights int8 the same way (scale = max|row| / 127); inputs int8 per token, dynamic
    w8a8_tensor  as w8a8, but one input scale for the whole tensor: the setting where a few outlier
                 features coarsen the grid of every other feature (LLM.int8, SmoothQuant)
    fp8          weights and inputs cast to float8 e4m3, scaled per output channel / per token to its range

``quantized(model, scheme)`` returns a quantized copy; the model passed in is never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

INT8_LEVELS = 127
INT4_LEVELS = 7
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


class QuantizationError(ValueError):
    """A scheme that does not exist, or cannot apply to a layer of this model (the message names it)."""


def _scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """amax / top, with 1 where amax is 0: an all-zero row stays zero instead of dividing by zero."""
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


def round_to_int(x: torch.Tensor, levels: int, dim: int | None) -> torch.Tensor:
    """Symmetric round-to-nearest onto {-levels..levels} * scale, scale = max|x| / levels over ``dim``
    (each slice along the other axes gets its own scale), or over the whole tensor when ``dim`` is None."""
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    scale = _scale(amax, levels)
    return (x / scale).round().clamp(-levels, levels) * scale


def round_to_fp8(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Cast to float8 e4m3 after scaling max|x| over ``dim`` to its largest value, and back."""
    scale = _scale(x.abs().amax(dim=dim, keepdim=True), FP8_MAX)
    return (x / scale).to(FP8).to(x.dtype) * scale


@dataclass(frozen=True)
class Scheme:
    weights: Callable[[torch.Tensor], torch.Tensor]  # applied to a (out, in) weight
    inputs: Callable[[torch.Tensor], torch.Tensor] | None  # applied to a (..., in) input, or None: float


# Weights are (out_features, in_features): a row is an output channel, so its scale is over dim 1.
# Inputs are (..., in_features): a token's features are the last dim.
SCHEMES: dict[str, Scheme] = {
    "w8a8": Scheme(lambda w: round_to_int(w, INT8_LEVELS, 1), lambda x: round_to_int(x, INT8_LEVELS, -1)),
    "w8a8_tensor": Scheme(lambda w: round_to_int(w, INT8_LEVELS, 1), lambda x: round_to_int(x, INT8_LEVELS, None)),
    "w4a16": Scheme(lambda w: round_to_int(w, INT4_LEVELS, 1), None),
    "fp8": Scheme(lambda w: round_to_fp8(w, 1), lambda x: round_to_fp8(x, -1)),
}


def check_schemes(names) -> list[str]:
    names = list(names)
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        raise QuantizationError(
            f"unknown quantization scheme {unknown[0]!r}; the schemes are: {', '.join(SCHEMES)} (quant=[w8a8,fp8])"
        )
    return names


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers a scheme quantizes, by name (``layers.0.attn.qkv_proj``, ...); refuses a
    2-D weight inside the blocks that is not an ``nn.Linear``, which no scheme here knows how to round."""
    linears = {}
    for name, module in model.layers.named_modules(prefix="layers"):
        if isinstance(module, nn.Linear):
            linears[name] = module
            continue
        for param_name, param in module.named_parameters(recurse=False):
            if param.ndim == 2:
                raise QuantizationError(
                    f"{name}.{param_name} is a matrix outside an nn.Linear ({type(module).__name__}); "
                    "the schemes quantize linear layers only"
                )
    return linears


def _quantize_inputs(fn: Callable[[torch.Tensor], torch.Tensor]):
    def hook(module: nn.Module, args: tuple) -> tuple:
        return (fn(args[0]), *args[1:])

    return hook


def quantized(model: nn.Module, scheme: str) -> nn.Module:
    """A copy of ``model`` with every block linear fake-quantized by ``scheme``."""
    check_schemes([scheme])
    rule = SCHEMES[scheme]
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for name, linear in block_linears(copied).items():
            if not torch.isfinite(linear.weight).all():
                raise QuantizationError(f"{scheme}: {name} has non-finite weights (the run diverged?)")
            linear.weight.copy_(rule.weights(linear.weight.float()).to(linear.weight.dtype))
            if rule.inputs is not None:
                linear.register_forward_pre_hook(_quantize_inputs(rule.inputs))
    return copied
