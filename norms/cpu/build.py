"""Build the C kernels once per machine and load them with ctypes; None where they cannot be built.

The libraries have no Python or torch headers, so a build is one ``cc`` call (about a second),
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

HERE = Path(__file__).parent
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
# name -> (source, extra compiler flags, libraries). pointwise.c needs -ffast-math so that tanhf and
# erff vectorize through glibc's libmvec.
LIBRARIES = {
    "rms_norm": ("rms_norm.c", [], []),
    "pointwise": ("pointwise.c", ["-ffast-math"], ["-lmvec", "-lm"]),
}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "normlab" / "kernels"


def _cpu_features() -> str:
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return ""


def _build(command: list[str], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # build aside, then rename: no half-written .so
        built = Path(tmp) / target.name
        subprocess.run([*command, "-o", str(built)], check=True, capture_output=True, text=True)
        os.replace(built, target)


@functools.cache
def load_library(name: str) -> ctypes.CDLL | None:
    """The kernel library ``name`` (see LIBRARIES), or None, with one warning, when it is off or cannot be built."""
    if os.environ.get("NORMLAB_CPU_KERNEL", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        warnings.warn(f"normlab: no C compiler found; the {name} norms run the reference ops (slower)", stacklevel=2)
        return None
    source, extra_flags, libraries = LIBRARIES[name]
    command = [compiler, *FLAGS, *extra_flags, str(HERE / source), *libraries]
    key = hashlib.sha256((HERE / source).read_bytes() + " ".join(command).encode() + _cpu_features().encode())
    target = _cache_dir() / f"{name}_{key.hexdigest()[:16]}.so"
    try:
        if not target.exists():
            _build(command, target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        warnings.warn(
            f"normlab: the {name} CPU kernel could not be built ({detail}); using the reference ops", stacklevel=2
        )
        return None
