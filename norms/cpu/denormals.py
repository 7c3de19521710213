"""Flushing subnormal floats to zero on every CPU thread, with the C library's helper (norms/cpu/rms_norm.c).

Apart from the RMSNorm ops (norms/cpu/rms_norm.py) so that a run which sets it up does not import them, and
with them torch.compile's machinery.
"""

from __future__ import annotations

import ctypes

import torch

from norms.cpu.build import load_library


def flush_denormals() -> bool:
    """Flush subnormal floats to zero on every CPU thread (see rms_norm.c); False where it cannot."""
    torch.set_flush_denormal(True)  # the calling thread
    library = load_library("rms_norm")
    if library is None:
        return False
    library.flush_denormals.argtypes = [ctypes.c_int]
    library.flush_denormals(torch.get_num_threads())
    return True
