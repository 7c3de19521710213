"""C kernels for norms on CPU (``rms_norm``: RMSNorm and pRMSNorm; ``pointwise``: DyT and Derf): built once per
machine with the system compiler, loaded with ctypes, wrapped as torch custom ops, each imported when a norm
that runs on it is built (``norms.registry.backend``). Each falls back to the reference ops, with a warning,
where it cannot be built."""
