"""A C kernel for RMSNorm on CPU: built once per machine with the system compiler, loaded with ctypes."""

from norms.cpu.ops import applies, available, cpu_rms_norm

__all__ = ["applies", "available", "cpu_rms_norm"]
