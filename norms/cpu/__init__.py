"""C kernels for norms on CPU (RMSNorm and pRMSNorm; DyT and Derf): built once per machine with the
system compiler, loaded with ctypes, wrapped as torch custom ops. Each falls back to the
reference ops, with a warning, where it cannot be built."""

from norms.cpu import pointwise
from norms.cpu.pointwise import cpu_pointwise
from norms.cpu.rms_norm import applies, available, cpu_rms_norm, flush_denormals

__all__ = ["applies", "available", "cpu_pointwise", "cpu_rms_norm", "flush_denormals", "pointwise"]
