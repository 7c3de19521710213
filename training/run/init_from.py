"""``train.init_from``: a new run that starts from another run's weights (any normlab run, or an imported model).

It fine-tunes the source as ``from_pretrained`` would: the model's architecture (its shape, head layout, RoPE,
norms and placement), the tokenizer and the source's ``train.seq_len`` are the source's, except where the user
sets a key (``user_keys``: named on the command line, or composed to another value than the default config's).
The run's record names each value that came from the source (``runtime.init_from.architecture``), and a resume
takes them from there, so the source is read once. Swapping the norm or the placement is such a setting: tensors
whose name and shape match load, the rest (a LayerNorm's bias) start as a fresh run of this seed would, and the
record lists both.

What would load the same shapes into another function is refused before any data is read: another head layout
(4 heads of 16 features and 8 of 8 have the same matrices), head size, RoPE theta or scaling. Another context
is allowed and named. Only step 0 is seeded: the optimizer, the schedule, the RNG and the data order are the
run's own, as for any new run, and a restart before the run's first checkpoint reads the very checkpoint its
record names, not the source's newest.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from model import ModelConfig
from model.config import ModelShape, NormConfig, NormOptions, NormRoles
from model.from_state import model_config_of
from training.checkpoints.files import list_checkpoints
from training.checkpoints.sharded import read_checkpoint
from training.config import LABELLED_GROUPS, Config, ConfigError, typed_config
from training.data.tokenizer import get_tokenizer, read_tokenizer_file
from training.errors import CheckpointError
from training.run.label import variant_label
from training.run.resume import find_record

log = logging.getLogger("normlab.train")
# Fields a difference in which makes the same shapes compute another function.
SAME_FUNCTION = ("n_heads", "n_kv_heads", "head_dim", "rope_theta", "rope_scaling")
NORM_OPTIONS = tuple(f"norm.{f.name}" for f in dataclasses.fields(NormOptions))
# The model and norm groups' keys; the embedding rows are the run's own (its tokenizer's, which is the source's).
ARCHITECTURE_KEYS = tuple(
    [f"model.{f.name}" for f in dataclasses.fields(ModelShape) if f.name != "vocab_size"]
    + [f"norm.{f.name}" for f in dataclasses.fields(NormConfig)]
)
TRAINING_KEYS = ("train.seq_len",)  # an imported model's context can be far longer than one trains at


@dataclass
class Source:
    """The checkpoint a new run starts from: where it is, its tokenizer, the config values the run takes from it
    (key -> value), and its model config and weights (None when the run resumes from its own checkpoint)."""

    path: Path
    tokenizer: Tokenizer
    architecture: dict[str, Any]
    model_config: ModelConfig | None = None
    state: dict[str, Any] | None = None


def value_at(cfg, key: str):
    """The value of a dotted key (``norm.qk``) in a typed config."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def set_value(cfg, key: str, value) -> None:
    """Set a dotted key (``norm.qk``) in a typed config."""
    parent, _, leaf = key.rpartition(".")
    setattr(value_at(cfg, parent) if parent else cfg, leaf, value)


CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def default_config(overrides: list[str]) -> Config:
    """The config train.py composes from ``overrides`` alone (inside a Hydra app, from the app's own config
    folder)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return typed_config(compose("config", overrides=overrides))
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return typed_config(compose("config", overrides=overrides))


def run_label(cfg: Config) -> str:
    """The variant label of a typed run config (``${norm_variant:}`` of the composed one)."""
    return variant_label(lambda key: value_at(cfg, key), LABELLED_GROUPS)


def command_line_overrides() -> list[str]:
    """This Hydra job's overrides from the command line (none outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def user_keys(cfg: Config, overrides: list[str]) -> set[str]:
    """The architecture and training keys the user set: named in ``overrides`` (the command line's; choosing a
    model group names all its keys), or composed to another value than the default config's with the same norm
    group (an experiment's settings, a variant's options; not the group's own options: ``norm=layernorm`` on a
    LayerNorm source without biases keeps them out)."""
    named, norm_group = set(), []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key == "model":  # a preset: its shape
            named |= {k for k in ARCHITECTURE_KEYS if k.startswith("model.")}
        elif key == "norm":  # a norm type: its name; its group's own option values are no one's choice
            named.add("norm.name")
            norm_group = [override.lstrip("+~")]
        elif key.startswith(("model.", "norm.", "train.")):
            named.add(key)
    defaults = default_config(norm_group)
    for key in (*ARCHITECTURE_KEYS, *TRAINING_KEYS):
        if key in named or any(key.startswith(k + ".") or k.startswith(key + ".") for k in named):
            named.add(key)
        elif value_at(cfg, key) != value_at(defaults, key):
            named.add(key)
    return named & {*ARCHITECTURE_KEYS, *TRAINING_KEYS}


def read_source(cfg: Config, run_dir: Path, keys_set: set[str]) -> Source:
    """The source of ``cfg.train.init_from`` for the run in ``run_dir``. A run that has a checkpoint resumes from
    it: its tokenizer is its own and its architecture what its record says came from the source (the source is
    not read). Otherwise the checkpoint the record names (a restart) or the source's newest readable one is read,
    and the run takes every value that ``keys_set`` does not name."""
    found = find_record(run_dir)
    recorded = ((found[0].get("runtime") or {}).get("init_from") or {}) if found else {}
    own = Path(run_dir) / "tokenizer.json"
    if list_checkpoints(run_dir) and own.is_file():
        tokenizer = read_tokenizer_file(own, "the run", "restore the tokenizer.json it was trained with")
        return Source(own, tokenizer, recorded.get("architecture") or {})
    where = recorded.get("source") or cfg.train.init_from
    if not Path(where).exists():
        restart = f" (its record says the run started from {where})" if recorded.get("source") else ""
        raise CheckpointError(
            f"train.init_from={cfg.train.init_from}: no such run directory or checkpoint{restart}; give a run "
            "directory of train.py or scripts/import_hf.py, or one of its checkpoints"
        )
    path, state = read_checkpoint(where)
    try:
        tokenizer = Tokenizer.from_str(state["tokenizer"])
    except Exception as err:
        raise CheckpointError(
            f"train.init_from={path} carries a tokenizer that cannot be read ({' '.join(str(err).split())[:120]})"
        ) from None
    if cfg.data.tokenizer != "bpe" and get_tokenizer(cfg.data, None, None).to_str() != state["tokenizer"]:
        raise ConfigError(
            f"data.tokenizer={cfg.data.tokenizer} is not the tokenizer of train.init_from={cfg.train.init_from}, "
            "whose embeddings are its tokens': leave data.tokenizer unset (the source's is used)"
        )
    try:
        saved = model_config_of(state["model_config"], str(path))
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    taken = architecture(saved, state.get("config") or {}, keys_set, cfg.norm.name)
    return Source(path, tokenizer, taken, saved, state)


def architecture(saved: ModelConfig, run_config: dict, keys_set: set[str], norm_name: str) -> dict[str, Any]:
    """The config values (plain, as the record keeps them) a run takes from a source whose model config is
    ``saved`` and whose record is ``run_config``: every key that ``keys_set`` does not name; the norm's options
    and per-role options only where the run's norm type (``norm_name``, named or not) is the source's: another
    type has options of its own, and naming the source's own (norm=rmsnorm on an imported Llama) keeps its eps
    and cast order."""
    values = {key: value_at(saved, key.removeprefix("model.")) for key in ARCHITECTURE_KEYS}
    values["norm.roles"] = saved.norm.role_options()
    values |= {key: (run_config.get("train") or {}).get(key.removeprefix("train.")) for key in TRAINING_KEYS}
    theirs = "norm.name" not in keys_set or norm_name == saved.norm.name
    return {
        key: value
        for key, value in values.items()
        if key not in keys_set and (theirs or not (key in NORM_OPTIONS or key == "norm.roles"))
    }


def adopt(cfg: Config, source: Source) -> None:
    """Set the values the run takes from its source in ``cfg``."""
    for key, value in source.architecture.items():
        if key == "norm.roles":  # the roles that are set, as the record keeps them
            value = NormRoles(**{role: NormOptions(**options) for role, options in value.items()})
        set_value(cfg, key, value)


def check_same_function(model, source: Source) -> None:
    """Refuse, before any data is read, a model that none of the source's tensors fits, and one into whose
    attention the source's tensors would load with another head layout or RoPE (the same shapes, another
    function)."""
    ours, theirs = model.cfg, source.model_config
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    fits = [name for name, tensor in source.state["model"].items() if shapes.get(name) == tuple(tensor.shape)]
    if not fits:
        settings = " ".join(f"model.{k}={getattr(theirs, k)}" for k in ("d_model", "n_layers", "mlp_hidden"))
        raise ConfigError(
            f"train.init_from={source.path}: none of its tensors fits this model (another size); leave the model's "
            f"size unset to take the source's ({settings})"
        )
    if not any(".attn." in name for name in fits):
        return
    for name in SAME_FUNCTION:
        mine, its = getattr(ours, name), getattr(theirs, name)
        if mine != its:
            key = "model.head_size" if name == "head_dim" else f"model.{name}"
            raise ConfigError(
                f"{key}={mine} where train.init_from={source.path} has {its}: its attention tensors would load into "
                f"another {'RoPE' if 'rope' in name else 'head layout'} (the same shapes, another function); leave "
                f"{key} unset to fine-tune the source's"
            )


def load_weights(model, source: Source) -> dict[str, Any]:
    """Copy the source's tensors whose name and shape match into ``model`` (the rest keep their fresh draws) and
    return what the run's record says of it: the checkpoint read, its step, the values taken from it, and which
    tensors loaded, which are new and which of the source's went unused."""
    state, ours = source.state, model.state_dict()
    theirs = state["model"]
    matched = {name: tensor for name, tensor in theirs.items() if name in ours and ours[name].shape == tensor.shape}
    model.load_state_dict(matched, strict=False)
    record = {
        "source": str(source.path),
        "step": state["step"],
        "architecture": source.architecture,
        "loaded": len(matched),
        "new": sorted(name for name in ours if name not in matched),
        "unused": sorted(name for name in theirs if name not in matched),
    }
    context = source.model_config.max_seq_len
    if model.cfg.max_seq_len != context:
        record["context"] = {"source": context, "run": model.cfg.max_seq_len}
        log.warning("the source was trained for %d positions, this run's model.max_seq_len is %d", context,
                    model.cfg.max_seq_len)  # fmt: skip
    log.info(
        "initialized from %s (step %d): %d values of its config taken, %d tensors loaded, %d new %s, %d of the "
        "source's unused",
        source.path,
        state["step"],
        len(source.architecture),
        record["loaded"],
        len(record["new"]),
        record["new"][:4],
        len(record["unused"]),
    )
    return record
