"""A run's design choice as a readable label (``rmsnorm-peri-qk``, ``layernorm-post-zloss0.0001``).

The norm's name; then the placement (pre-norm adds nothing, a variant's placement may word its own part
through ``label`` in its file); then each switch away from its default, in the schema's order: a switch is a
schema field that declares its part beside itself (``label``, a format of ``value``; ``type``, empty for the
stream's norm type, and ``over_all``, ``_all`` where q, k and v are normalized over all heads): model/config.py
for the norm and model groups, training/config.py for the norm's options and the train group. The config's
``variant`` label, the readable part of a run name (``run_record.overrides_tag``) and every report's labels
read it; adding a switch adds no row here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from model.assembly import placement_module
from model.config import ModelShape, NormConfig, NormOptions

Lookup = Callable[[str], Any]  # a dotted config key -> its value
READ_BY_PARTS = ("norm.qk_axis", "norm.post_fraction")  # keys the parts read besides their own


Groups = tuple[tuple[str, type], ...]  # (group, its schema dataclass): the run config's other labelled fields


def switches(groups: Groups = ()) -> list[tuple[str, Any, dict]]:
    """Every labelled field as (its config key, its default, its metadata), in label order: the norm group's
    structure, the model group's, then each of ``groups``' (training/config.py: the norm's options, the train
    group)."""
    options = {f.name for f in dataclasses.fields(NormOptions)}
    fields = [(f"norm.{f.name}", f) for f in dataclasses.fields(NormConfig) if f.name not in options]
    fields += [(f"model.{f.name}", f) for f in dataclasses.fields(ModelShape)]
    fields += [(f"{group}.{f.name}", f) for group, schema in groups for f in dataclasses.fields(schema)]
    return [(key, f.default, f.metadata) for key, f in fields if f.metadata.get("label")]


def _placement_part(placement: str, get: Lookup) -> str | None:
    if placement == "pre":
        return None
    module = placement_module(placement)
    return module.label(placement, get) if hasattr(module, "label") else str(placement)


def variant_label(get: Lookup, groups: Groups = ()) -> str:
    """The label of the config that ``get`` reads: the norm's name, then each switch away from its default."""
    norm = get("norm.name")
    parts = [str(norm), _placement_part(str(get("norm.placement")), get)]
    over_all = "_all" if get("norm.qk_axis") == "all" else ""
    for key, default, metadata in switches(groups):
        value = get(key)
        if value is None or value == default or value in metadata.get("quiet", ()):
            continue
        kind = "" if value == norm else f"_{value}"
        parts.append(metadata["label"].format(value=value, type=kind, over_all=over_all))
    return "-".join(part for part in parts if part is not None)


def label_keys(groups: Groups = ()) -> tuple[str, ...]:
    """Every config key the label depends on."""
    return ("norm.name", "norm.placement", *(key for key, _, _ in switches(groups)), *READ_BY_PARTS)
