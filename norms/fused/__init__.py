"""The fused Triton RMSNorm: kernels, custom ops with autograd, and the module."""

from norms.fused.module import FusedRMSNorm
from norms.fused.ops import MAX_SINGLE_BLOCK, fused_add_rms_norm, fused_rms_norm, kernel_backend

__all__ = ["MAX_SINGLE_BLOCK", "FusedRMSNorm", "fused_add_rms_norm", "fused_rms_norm", "kernel_backend"]
