"""Where a norm's name becomes code: a norm's config name its module class, a backend's name its module.

Configs and checkpoints keep the name (a string, serializable); ``build_norm`` resolves it. The tables hold
import paths, so a class is imported when it is first asked for: importing ``norms`` loads neither Triton nor a
C kernel. (The rest of normlab's lazy tables resolve through model/registry.py: this package imports nothing of
ours, and nothing of ours but norms is resolved here.)
"""

from __future__ import annotations

import importlib
import inspect

_NORMS = {
    "layernorm": "norms.layernorm:LayerNorm",
    "rmsnorm": "norms.rmsnorm:RMSNorm",
    "prmsnorm": "norms.rmsnorm:PartialRMSNorm",
    "fused_rmsnorm": "norms.fused.module:FusedRMSNorm",
    "dyt": "norms.dynamic:DyT",
    "derf": "norms.dynamic:Derf",
    "identity": "norms.identity:Identity",
    "l2norm": "norms.l2norm:L2Norm",
}

# Optional implementations a norm runs on: the C kernels on CPU, the Triton kernel on GPU.
_BACKENDS = {
    "cpu_rms_norm": "norms.cpu.rms_norm",
    "cpu_pointwise": "norms.cpu.pointwise",
    "triton_rms_norm": "norms.fused.ops",
}

NORM_NAMES: tuple[str, ...] = tuple(_NORMS)
_loaded_backends: dict = {}


def lazy_import(path: str):
    """What ``norms.module:name`` names (or the module itself, without ``:name``), its module imported now."""
    module, _, name = path.partition(":")
    imported = importlib.import_module(module)
    return getattr(imported, name) if name else imported


def norm_class(name: str) -> type:
    """The module class registered as ``name`` (imported on first use)."""
    try:
        path = _NORMS[name]
    except KeyError:
        raise ValueError(f"unknown norm {name!r}; known norms: {', '.join(NORM_NAMES)}") from None
    return lazy_import(path)


def backend(name: str):
    """The backend module registered as ``name``, imported the first time a norm that runs on it asks (then read
    from a dict, which torch.compile traces through where an import would break the graph)."""
    module = _loaded_backends.get(name)
    if module is None:
        module = _loaded_backends[name] = lazy_import(_BACKENDS[name])
    return module


def norm_options(name: str) -> tuple[str, ...]:
    """The keyword options a norm accepts besides ``dim`` (for error messages and config checks)."""
    params = inspect.signature(norm_class(name).__init__).parameters
    return tuple(p for p in params if p not in ("self", "dim"))


def build_norm(name: str, dim: int, **options):
    """Build the norm called ``name`` over ``dim`` features, e.g. ``build_norm("prmsnorm", 512, p=0.0625)``."""
    cls = norm_class(name)
    unknown = sorted(set(options) - set(norm_options(name)))
    if unknown:
        raise ValueError(
            f"norm {name!r} does not take option(s) {', '.join(unknown)}; "
            + (f"its options are: {', '.join(norm_options(name))}" if norm_options(name) else "it takes no options")
        )
    try:
        return cls(dim, **options)
    except ValueError as err:
        raise ValueError(f"norm {name!r}: {err}") from None
