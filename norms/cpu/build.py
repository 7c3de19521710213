"""Build the C kernel once per machine and load it with ctypes; None where it cannot be built.

The library has no Python or torch headers, so a build is one ``cc`` call (about a second),
not a torch extension build. It is cached under ``$XDG_CACHE_HOME/normlab/kernels`` (or
``~/.cache``) by a hash of the source, the compiler and the CPU's features (``-march=native``).
``NORMLAB_CPU_KERNEL=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("rms_norm.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "normlab" / "kernels"


def _cpu_features() -> str:
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return ""


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # build aside, then rename: no half-written .so
        built = Path(tmp) / target.name
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True, capture_output=True, text=True)
        os.replace(built, target)


@functools.cache
def load_library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None (with one warning) when it is off or cannot be built here."""
    if os.environ.get("NORMLAB_CPU_KERNEL", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        warnings.warn("normlab: no C compiler found; CPU RMSNorm runs the reference ops (slower)", stacklevel=2)
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + compiler.encode() + " ".join(FLAGS).encode() + _cpu_features().encode())
    target = _cache_dir() / f"rms_norm_{key.hexdigest()[:16]}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        library = ctypes.CDLL(str(target))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        warnings.warn(
            f"normlab: the CPU RMSNorm kernel could not be built ({detail}); using the reference ops", stacklevel=2
        )
        return None
    pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    library.rms_norm_fwd_f32.argtypes = [*[pointer] * 4, i64, i64, i64, ctypes.c_float, i32, i32]
    library.rms_norm_bwd_f32.argtypes = [*[pointer] * 6, i64, i64, i64, i32, i32]
    for function in (library.rms_norm_fwd_f32, library.rms_norm_bwd_f32):
        function.restype = None
    return library
