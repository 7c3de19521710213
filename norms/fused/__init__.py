"""The fused Triton RMSNorm: kernels (``kernels``), custom ops with autograd (``ops``), and the module (``module``)."""
