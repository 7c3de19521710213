"""The model a checkpoint holds, built without trusting what its config declares.

A checkpoint's model config says how large the model is; a small file can declare a model of terabytes. So the
model is built on the meta device first (names and shapes, no memory), its parameters are checked against the
tensors the checkpoint really holds, and only then does it take memory: the checkpoint's own tensors, assigned,
not copied. A checkpoint that names fields this code does not know, or whose tensors do not fit its config, is
refused in one line.
"""

from __future__ import annotations

import dataclasses

import torch

from model import ModelConfig, Transformer, build_model
from model.transformer import ROPE_POSITIONS

# The names old checkpoints stored each norm field under (one flat dict), and where they are now.
FLAT_NORM_FIELDS = {
    "norm": "name",
    "placement": "placement",
    "layer_placements": "layer_placements",
    "post_fraction": "post_fraction",
    "qk_norm": "qk",
    "qk_axis": "qk_axis",
    "v_norm": "v",
    "after_linear_norm": "after_linear",
    "norm_depth_scaling": "depth_scaling",
}


def model_config_of(saved: dict, source: str) -> ModelConfig:
    """The ModelConfig a checkpoint stored, refusing fields this code does not know and values it refuses. One
    written before the norm fields were grouped holds them flat (``norm`` the type's name, ``qk_norm``,
    ``norm_options``, ``norm_role_options``, ...); fields added since count at their defaults, which is what the
    code that wrote it did."""
    saved = dict(saved)
    if not isinstance(saved.get("norm", {}), dict):
        norm = {new: saved.pop(old) for old, new in FLAT_NORM_FIELDS.items() if old in saved}
        norm.update(saved.pop("norm_options", {}))
        norm["roles"] = saved.pop("norm_role_options", {})
        saved["norm"] = norm
    try:
        return ModelConfig(**saved)
    except TypeError as err:  # a field this code does not have
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(saved) - known) or [str(err).rpartition(" ")[2].strip("'")]
        raise ValueError(
            f"{source} has model config fields this code does not know ({', '.join(unknown)}); use the normlab "
            "version that wrote it"
        ) from None
    except ValueError as err:
        raise ValueError(f"{source} holds a model config this code refuses: {err}") from None


def check_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Refuse ``weights`` unless they are exactly ``model``'s parameters and saved buffers, name by name and shape
    by shape (``model`` may be on the meta device)."""
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    missing = sorted(expected.keys() - weights.keys())
    extra = sorted(weights.keys() - expected.keys())
    wrong = sorted(name for name in expected.keys() & weights.keys() if tuple(weights[name].shape) != expected[name])
    if missing or extra or wrong:
        problem = (
            f"has no {missing[0]}" if missing else f"has {extra[0]}, which its config has no place for" if extra else
            f"holds {wrong[0]} of shape {list(weights[wrong[0]].shape)} where its config implies {list(expected[wrong[0]])}"
        )  # fmt: skip
        raise ValueError(f"{source} does not match the model its config describes: it {problem}")


def model_from_state(saved_config: dict, weights: dict[str, torch.Tensor], source: str) -> Transformer:
    """The model of ``saved_config`` holding ``weights`` (a checkpoint's ``model_config`` and ``model``), its
    memory the weights' own; a ValueError naming ``source`` when they do not fit."""
    cfg = model_config_of(saved_config, source)
    with torch.device("meta"):
        model = build_model(cfg)
    check_weights(model, weights, source)
    model.load_state_dict(weights, assign=True)
    if cfg.tie_embeddings:  # assigned, the two names hold two tensors: one parameter again
        model.lm_head.weight = model.tok_embeddings.weight
    model.build_rope(min(cfg.max_seq_len, ROPE_POSITIONS), model.tok_embeddings.weight.device)
    return model
