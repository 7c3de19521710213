"""``FusedRMSNorm``: the module behind ``norm=fused_rmsnorm``."""

from __future__ import annotations

import torch

from norms import registry
from norms.rmsnorm import RMSNorm, resolve_partial_k


class FusedRMSNorm(RMSNorm):
    """RMSNorm (or pRMSNorm with ``k``/``p``) computed by the fused Triton kernel.

    Same parameters and numerics as :class:`norms.RMSNorm`, so checkpoints move between the
    two. With a residual it adds and normalizes in one pass. Where Triton cannot run (no GPU,
    no interpreter) it runs as RMSNorm does there, the C kernel on CPU, and says so in
    ``backend``.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        k: int | None = None,
        p: float | None = None,
        cast_before_weight: bool = False,
        gain: str = "standard",
    ) -> None:
        super().__init__(dim, eps, cast_before_weight, gain)
        self.k = dim if k is None and p is None else resolve_partial_k(dim, p, k)
        registry.backend("triton_rms_norm")  # Triton loads with the first fused norm, not with the library

    def _options(self) -> dict:
        return {"cast_before_weight": self.cast_before_weight, "zero_centered": self.zero_centered}

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        ops = registry.backend("triton_rms_norm")
        if ops.kernel_backend(x.device) == "reference":
            return super().normalize(x)
        return ops.fused_rms_norm(x, self.weight, self.eps, self.k, **self._options())

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        ops = registry.backend("triton_rms_norm")
        if residual is None or ops.kernel_backend(x.device) == "reference":
            return super().forward(x, residual)
        if x.dtype != residual.dtype:  # the sum in the dtype x + residual has: a bf16 branch onto a float32 stream
            dtype = torch.promote_types(x.dtype, residual.dtype)
            x, residual = x.to(dtype), residual.to(dtype)
        normalized, total = ops.fused_add_rms_norm(x, residual, self.weight, self.eps, self.k, **self._options())
        return self.scaled(normalized), total

    def plain_rms_norm_weight(self) -> torch.Tensor | None:
        return self.gain_or_ones() * self.output_scale if self.k == self.dim else None

    def backend(self, device: torch.device | str) -> str:
        backend = registry.backend("triton_rms_norm").kernel_backend(device)
        return super().backend(device) if backend == "reference" else backend

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}"
