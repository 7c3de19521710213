"""normlab's normalization library: reference ops, modules, a fused Triton RMSNorm, one registry.

Stands alone: nothing here imports the model or the training code. The reference ops load with
the library; each module class the first time it is named (``norms.LayerNorm``, ``build_norm``),
and its backend (a C kernel, the Triton kernel) the first time such a norm is built.
"""

from norms.base import GAINS, Norm
from norms.functional import derf, dyt, l2_norm, layer_norm, partial_rms_norm, rms_norm
from norms.registry import NORM_NAMES, backend, build_norm, lazy_import, norm_class, norm_options

_LAZY = {
    "LayerNorm": "norms.layernorm",
    "RMSNorm": "norms.rmsnorm",
    "PartialRMSNorm": "norms.rmsnorm",
    "DyT": "norms.dynamic",
    "Derf": "norms.dynamic",
    "Identity": "norms.identity",
    "L2Norm": "norms.l2norm",
    "FusedRMSNorm": "norms.fused.module",
    "fused_rms_norm": "norms.fused.ops",
    "fused_add_rms_norm": "norms.fused.ops",
}


def __getattr__(name: str):
    if name in _LAZY:
        return lazy_import(f"{_LAZY[name]}:{name}")
    raise AttributeError(f"module 'norms' has no attribute {name!r}")


__all__ = [
    "GAINS",
    "NORM_NAMES",
    "Derf",
    "DyT",
    "FusedRMSNorm",
    "Identity",
    "L2Norm",
    "LayerNorm",
    "Norm",
    "PartialRMSNorm",
    "RMSNorm",
    "backend",
    "build_norm",
    "derf",
    "dyt",
    "fused_add_rms_norm",
    "fused_rms_norm",
    "l2_norm",
    "layer_norm",
    "norm_class",
    "norm_options",
    "partial_rms_norm",
    "rms_norm",
]
