"""How a model config becomes classes, in one place: ``assemble`` resolves the placement once into the model's
class and each layer's block class, and mixes the chosen variants' parts into them under honest names
(``PreNormBlock[gated_attention]``, its attention ``Attention[gated_attention]``), so a printed model says what
it computes.

A placement (model/registry.py) names a block class (every layer), a function of the config that gives each
layer's placement (a mix), or a model class of its own, whose ``layer_block`` every layer takes. A switch away
from its default plugs in its variant's ATTENTION, MLP and BLOCK parts; each variant refuses what it cannot take.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType

from model.blocks import Block
from model.config import ModelConfig
from model.registry import PLACEMENTS, SWITCHES, resolve


@dataclass(frozen=True)
class Assembly:
    """Each layer's block class, and the model class a placement of its own names (None: the Transformer)."""

    blocks: tuple[type[Block], ...]
    model: type | None = None


def placement_target(placement: str):
    """What a placement's name stands for: a block class, a function of the config, or a model class."""
    return resolve(PLACEMENTS[placement])


def placement_module(placement: str) -> ModuleType:
    """The module a placement lives in (where its file may word its part of the run's label)."""
    return resolve(PLACEMENTS[placement].partition(":")[0])


def is_block(chosen) -> bool:
    return isinstance(chosen, type) and issubclass(chosen, Block)


def block_placements() -> list[str]:
    """The placements that are one layer's block (the others mix blocks or build a model of their own); this
    imports every placement's file."""
    return [name for name in PLACEMENTS if is_block(placement_target(name))]


def assemble(cfg: ModelConfig) -> Assembly:
    """The classes ``cfg`` builds; a ValueError naming the fix where its placements or switches cannot combine."""
    norms = cfg.norm
    chosen = placement_target(norms.placement)
    model = chosen if hasattr(chosen, "layer_block") else None  # a model of its own, and the block it takes
    if model is not None:
        if norms.layer_placements is not None:
            raise ValueError(
                f"norm.placement={norms.placement} is a whole model: norm.layer_placements cannot mix it with "
                "other placements"
            )
        blocks = [model.layer_block] * cfg.n_layers
    else:
        blocks = [_layer_block(p) for p in layer_placements(cfg, chosen)]
    variants = chosen_variants(cfg)
    parts = [
        combined(
            block,
            variants,
            "BLOCK",
            attention_class=combined(block.attention_class, variants, "ATTENTION"),
            mlp_class=combined(block.mlp_class, variants, "MLP"),
        )
        for block in blocks
    ]
    return Assembly(tuple(parts), model)


def layer_placements(cfg: ModelConfig, chosen) -> list[str]:
    """Each layer's placement: norm.layer_placements if given, else what norm.placement names for every layer."""
    if cfg.norm.layer_placements is not None:
        return list(cfg.norm.layer_placements)
    return [cfg.norm.placement] * cfg.n_layers if is_block(chosen) else chosen(cfg)


def _layer_block(placement: str) -> type[Block]:
    block = placement_target(placement) if placement in PLACEMENTS else None
    if not is_block(block):
        layers = ", ".join(block_placements())
        whole = f" ({placement} places the whole model: set norm.placement={placement})" if block else ""
        raise ValueError(
            f"norm.layer_placements: {placement!r} is not a layer's block; each layer takes one of: {layers}{whole}"
        )
    return block


def chosen_variants(cfg: ModelConfig) -> list[ModuleType]:
    """The variants' modules that ``cfg`` switches on, each once, in SWITCHES' order; each refuses a config it
    cannot take (ValueError, one line naming the fix)."""
    default = type(cfg)()
    modules = []
    for key, path in SWITCHES.items():
        group, _, name = key.partition(".")
        ours, theirs = (getattr(c.norm if group == "norm" else c, name) for c in (cfg, default))
        if ours != theirs and (module := resolve(path)) not in modules:
            modules.append(module)
    for module in modules:
        refusal = getattr(module, "refusal", lambda cfg: None)(cfg)
        if refusal:
            raise ValueError(refusal)
    return modules


def combined(base: type, variants: list[ModuleType], part: str, **attributes) -> type:
    """``base`` with each chosen variant's subclass for ``part`` (ATTENTION, MLP or BLOCK) mixed in, the first
    variant's innermost (its parts added first), and ``attributes`` set: one class per combination, named for the
    variants in it."""
    extensions = tuple(getattr(module, part) for module in reversed(variants) if hasattr(module, part))
    return _combined(base, extensions, tuple(attributes.items()))


@functools.cache
def _combined(base: type, extensions: tuple[type, ...], attributes: tuple) -> type:
    changed = {name: value for name, value in attributes if getattr(base, name) is not value}
    if not extensions and not changed:
        return base
    names = [extension.__module__.rpartition(".")[2] for extension in reversed(extensions)]
    for value in changed.values():
        names += [name for name in getattr(value, "variant_names", ()) if name not in names]
    return type(f"{base.__name__}[{', '.join(names)}]", (*extensions, base), {**changed, "variant_names": tuple(names)})
