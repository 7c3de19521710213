"""A run's design choice as a readable label (``rmsnorm-peri-qk``, ``rmsnorm-mix_ln0.25-zloss0.0001``).

The switches that make a variant are listed once, here: the config's ``variant`` label, the
readable part of a run name (``run_record.overrides_tag``) and the labels of every report read
this table. A switch at its default adds nothing to the label; adding a switch is one row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Lookup = Callable[[str], Any]  # a dotted config key -> its value


@dataclass(frozen=True)
class Switch:
    key: str  # the dotted config key
    part: Callable[[Any, Lookup], str | None]  # the label's part for a value (None: at its default, no part)


def _qk_part(qk: str | None, get: Lookup) -> str | None:
    if not qk:
        return None
    return "qk" + ("" if qk == get("norm.name") else f"_{qk}") + ("_all" if get("norm.qk_axis") == "all" else "")


def _norm_part(prefix: str, axis: bool = False) -> Callable[[Any, Lookup], str | None]:
    """``prefix`` for a norm type that is the stream's, ``prefix_<type>`` for another, nothing for none; with
    ``axis``, ``_all`` where the norm is over all heads."""

    def part(name: str | None, get: Lookup) -> str | None:
        if not name:
            return None
        over_all = "_all" if axis and get("norm.qk_axis") == "all" else ""
        return prefix + ("" if name == get("norm.name") else f"_{name}") + over_all

    return part


def _placement_part(placement: str, get: Lookup) -> str | None:
    """Nothing for pre-norm; Mix-LN with its fraction; HybridNorm's placements with ``_all`` where their q, k and
    v norms are over all heads (and no norm.qk says so already)."""
    if placement == "pre":
        return None
    if placement == "mix_ln":
        return f"mix_ln{get('norm.post_fraction'):g}"
    qkv_over_all = placement in ("hybrid", "hybrid_star") and get("norm.qk_axis") == "all" and not get("norm.qk")
    return f"{placement}_all" if qkv_over_all else str(placement)


def _number(prefix: str) -> Callable[[Any, Lookup], str | None]:
    return lambda value, get: None if value is None else f"{prefix}{value:g}"


SWITCHES = (
    Switch("norm.placement", _placement_part),
    Switch("norm.qk", _qk_part),
    Switch("norm.v", _norm_part("v", axis=True)),
    Switch("norm.after_linear", _norm_part("after_linear")),
    Switch("norm.gain", lambda v, get: None if v in (None, "standard") else f"gain_{v}"),
    Switch("norm.depth_scaling", lambda v, get: None if v == "none" else "lns"),
    Switch("model.embed_scale", lambda v, get: None if v == "none" else f"embed_{v}"),
    Switch("model.init_out_scale", lambda v, get: "init_out_none" if v == "none" else None),
    Switch("model.logit_softcap", _number("softcap")),
    Switch("model.attn_softcap", _number("attncap")),
    Switch("model.attn_gate", lambda v, get: None if v == "none" else f"gate_{v}"),
    Switch("model.attn_sink", lambda v, get: None if v == "none" else f"sink_{v}"),
    Switch("train.z_loss", lambda v, get: f"zloss{v:g}" if v else None),
    Switch("train.qk_clip", _number("qkclip")),
    Switch("train.weight_decay_mode", lambda v, get: "wd_independent" if v == "independent" else None),
    Switch("model.residual_scale", _number("resid")),
    Switch("model.outer_norm", lambda v, get: None if v is None else f"outer_{v}"),
    Switch("train.optimizer", lambda v, get: None if v == "adamw" else str(v)),
)
# Keys a switch's part also reads: overriding them changes the label, so they are readable in run names too.
READ_BY_SWITCHES = ("norm.post_fraction", "norm.qk_axis")


def variant_label(get: Lookup) -> str:
    """The label of the config that ``get`` reads: the norm's name, then each switch away from its default."""
    parts = [str(get("norm.name"))]
    parts += [part for switch in SWITCHES if (part := switch.part(get(switch.key), get)) is not None]
    return "-".join(parts)


def label_keys() -> tuple[str, ...]:
    """Every config key the label depends on."""
    return ("norm.name", *(switch.key for switch in SWITCHES), *READ_BY_SWITCHES)
