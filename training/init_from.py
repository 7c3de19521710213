"""``train.init_from``: a new run that starts from another run's weights (any normlab run, or an imported model).

It fine-tunes on any corpus with the source's tokenizer, and it is how a trained model's norm is swapped: weights
whose name and shape match load, the rest (a LayerNorm's bias, say) start as a fresh run of this seed would, and
the run's record lists both. Only step 0 is seeded: a run that already has a checkpoint resumes from its own, and
the optimizer, the schedule, the RNG and the data order are the run's own, as for any new run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from training.checkpoint import CheckpointError, list_checkpoints
from training.config import ConfigError
from training.sharded_checkpoint import read_checkpoint
from training.tokenizer import get_tokenizer, read_tokenizer_file

log = logging.getLogger("normlab.train")
SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_size", "mlp_hidden", "tie_embeddings")


@dataclass
class Source:
    """The checkpoint a new run starts from; ``state`` is None when the run resumes from its own checkpoint."""

    path: Path
    tokenizer: Tokenizer
    state: dict[str, Any] | None


def read_source(cfg, run_dir: Path) -> Source:
    """The source's tokenizer, which the data must be tokenized with, and its weights unless ``run_dir`` already has
    a checkpoint (then the tokenizer is the run's own, written at its start, and the source is not read)."""
    own = Path(run_dir) / "tokenizer.json"
    if list_checkpoints(run_dir) and own.is_file():
        return Source(own, read_tokenizer_file(own, "the run", "restore the tokenizer.json it was trained with"), None)
    if not Path(cfg.train.init_from).exists():
        raise CheckpointError(
            f"train.init_from={cfg.train.init_from}: no such run directory or checkpoint; give a run directory of "
            "train.py or scripts/import_hf.py, or one of its checkpoints"
        )
    path, state = read_checkpoint(cfg.train.init_from)
    tokenizer = Tokenizer.from_str(state["tokenizer"])
    if cfg.data.tokenizer != "bpe" and get_tokenizer(cfg.data, None, None).to_str() != state["tokenizer"]:
        raise ConfigError(
            f"data.tokenizer={cfg.data.tokenizer} is not the tokenizer of train.init_from={cfg.train.init_from}, "
            "whose embeddings are its tokens': leave data.tokenizer unset (the source's is used)"
        )
    return Source(path, tokenizer, state)


def load_weights(model, source: Source) -> dict[str, Any]:
    """Copy the source's tensors whose name and shape match into ``model`` (the rest keep their fresh draws) and
    return what the run's record says of it: the source, its step, how many loaded, which are new and unused."""
    state, ours = source.state, model.state_dict()
    theirs, their_model = state["model"], state["model_config"]
    if their_model["vocab_size"] != model.cfg.vocab_size:
        raise ConfigError(
            f"train.init_from={source.path} has {their_model['vocab_size']} embedding rows but this run's tokenizer "
            f"gives {model.cfg.vocab_size} (its size rounded up to a multiple of 64): leave data.tokenizer unset so "
            "that the source's is used; a source whose table is padded further (Qwen3's) cannot be fine-tuned here"
        )
    matched = {name: tensor for name, tensor in theirs.items() if name in ours and ours[name].shape == tensor.shape}
    if not matched:
        settings = " ".join(f"model.{key}={their_model[key]}" for key in SHAPE_KEYS if key in their_model)
        raise ConfigError(
            f"train.init_from={source.path}: none of its tensors fits this model (another size); build the "
            f"source's: {settings}"
        )
    model.load_state_dict(matched, strict=False)
    record = {
        "source": str(source.path),
        "step": state["step"],
        "loaded": len(matched),
        "new": sorted(name for name in ours if name not in matched),
        "unused": sorted(name for name in theirs if name not in matched),
    }
    log.info(
        "initialized from %s (step %d): %d tensors loaded, %d new %s, %d of the source's unused",
        source.path,
        state["step"],
        record["loaded"],
        len(record["new"]),
        record["new"][:4],
        len(record["unused"]),
    )
    return record
