"""The fused Triton RMSNorm: kernels (``kernels``), their launch table (``launch``), the calls with autograd and
torch.compile support (``ops``), and the module (``module``)."""
