"""normlab's normalization library: reference ops, modules, a fused Triton RMSNorm, one registry.

Stands alone: nothing here imports the model or the training code.
"""

from norms.functional import layer_norm, partial_rms_norm, rms_norm
from norms.fused import FusedRMSNorm, fused_add_rms_norm, fused_rms_norm
from norms.modules import LayerNorm, Norm, PartialRMSNorm, RMSNorm
from norms.registry import NORM_NAMES, build_norm, norm_options

__all__ = [
    "NORM_NAMES",
    "FusedRMSNorm",
    "LayerNorm",
    "Norm",
    "PartialRMSNorm",
    "RMSNorm",
    "build_norm",
    "fused_add_rms_norm",
    "fused_rms_norm",
    "layer_norm",
    "norm_options",
    "partial_rms_norm",
    "rms_norm",
]
