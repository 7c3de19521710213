"""normlab's normalization library: reference ops, modules, a fused Triton RMSNorm, one registry.

Stands alone: nothing here imports the model or the training code.
"""

from norms.functional import derf, dyt, l2_norm, layer_norm, partial_rms_norm, rms_norm
from norms.fused import FusedRMSNorm, fused_add_rms_norm, fused_rms_norm
from norms.modules import GAINS, Derf, DyT, Identity, L2Norm, LayerNorm, Norm, PartialRMSNorm, RMSNorm
from norms.registry import NORM_NAMES, build_norm, norm_class, norm_options

__all__ = [
    "GAINS",
    "NORM_NAMES",
    "Derf",
    "DyT",
    "Identity",
    "L2Norm",
    "FusedRMSNorm",
    "LayerNorm",
    "Norm",
    "PartialRMSNorm",
    "RMSNorm",
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
