"""The GPU check's stages (scripts/gpu_check.py runs them): correctness, kernels, profile, training, compiled
against eager, distributed, each a module of its own, and what they share (``stage``) and write (``report``)."""
