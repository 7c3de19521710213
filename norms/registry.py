"""The one place where a norm's config name becomes a module class.

Configs and checkpoints keep the name (a string, serializable); ``build_norm`` resolves it.
"""

from __future__ import annotations

import inspect

from norms.fused.module import FusedRMSNorm
from norms.modules import Derf, DyT, Identity, L2Norm, LayerNorm, Norm, PartialRMSNorm, RMSNorm

_NORMS: dict[str, type[Norm]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "prmsnorm": PartialRMSNorm,
    "fused_rmsnorm": FusedRMSNorm,
    "dyt": DyT,
    "derf": Derf,
    "identity": Identity,
    "l2norm": L2Norm,
}

NORM_NAMES: tuple[str, ...] = tuple(_NORMS)


def norm_options(name: str) -> tuple[str, ...]:
    """The keyword options a norm accepts besides ``dim`` (for error messages and config checks)."""
    params = inspect.signature(norm_class(name).__init__).parameters
    return tuple(p for p in params if p not in ("self", "dim"))


def norm_class(name: str) -> type[Norm]:
    try:
        return _NORMS[name]
    except KeyError:
        raise ValueError(f"unknown norm {name!r}; known norms: {', '.join(NORM_NAMES)}") from None


def build_norm(name: str, dim: int, **options) -> Norm:
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
