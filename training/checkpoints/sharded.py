"""Sharded checkpoints (``train.parallel=fsdp``): each process writes its own shards, any number of processes
(or none: eval.py, scripts/export_hf.py) reads them. Imported only when such a checkpoint is written or read.

A checkpoint is a directory ``checkpoints/step_0000200.dcp`` holding

- ``header.pt``: everything but the weights and the optimizer's moments (the step, the RNG states, the model
  and run configs, the tokenizer, the optimizer's param groups), written by rank 0 with ``torch.save`` and
  read with ``weights_only=True`` like every checkpoint of ours (training/checkpoints/files.py);
- ``torch.distributed.checkpoint``'s files (``.metadata``, ``__<rank>_0.distcp``): tensors only, keyed by
  parameter name (``model.layers.0.attn.qkv_proj.weight``, ``optimizer.layers.0.attn.qkv_proj.weight.exp_avg``)
  with their global shapes, so a run on another number of processes reads the slices it holds.

It is written to ``.step_0000200.dcp.tmp`` and renamed once every process has written its part, so a save
killed midway leaves the previous checkpoint in charge, as with ``.pt`` files. DCP reads its ``.metadata``
with ``pickle``, which can run code; here training/checkpoints/dcp_metadata.py reads it as data, and a checkpoint that
holds anything but tensors, or misses a shard, is refused before any tensor is read.

Either parallel mode reads the other's checkpoints: a sharded model loads a whole ``.pt`` (each process keeps
its shard), and a whole model loads a ``.dcp`` (each process reads every shard).
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
from torch.distributed.tensor import DTensor

from training.atomic import atomic_write
from training.checkpoints.dcp_metadata import read_metadata
from training.checkpoints.files import checkpoint_dir, prune_checkpoints
from training.checkpoints.load import load_checkpoint, load_newest_readable, resolve_checkpoint
from training.errors import CheckpointError
from training.step.distributed import Distributed

HEADER = "header.pt"  # training/checkpoints/files.py reads it as a .dcp checkpoint's state
# One process reading or writing every shard (no torchrun, or a whole model) is what we mean when DCP says this.
warnings.filterwarnings("ignore", message="torch.distributed is .*uninitialized, assuming the intent is to")


class SafeReader(FileSystemReader):
    """DCP's file reader, its metadata read by ``read_metadata``: as data, tensors only, every shard present."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _dcp(doing: str, call):
    """Run a DCP read or write, its failures one CheckpointError saying what it was ``doing``: torch's
    CheckpointException is a BaseException, which ``except Exception`` misses, and carries every rank's traceback."""
    try:
        return call()
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as err:
        causes = [cause for cause, _ in err.failures.values()] if isinstance(err, CheckpointException) else [err]
        reason = "; ".join(sorted({f"{type(c).__name__}: {str(c).strip().splitlines()[0][:200]}" for c in causes}))
        raise CheckpointError(f"could not {doing} ({reason})") from None


# What every checkpoint train.py writes holds and its readers need; a .pt holds the model's weights too.
NORMLAB_KEYS = ("step", "model_config", "config", "tokenizer")


def check_normlab_state(state: Any, source: Path) -> None:
    """Refuse in one line a checkpoint that is not ours (torch's dcp_to_torch_save writes the tensors alone),
    which would otherwise fail later on a missing key."""
    needed = (*NORMLAB_KEYS, *(() if source.suffix == ".dcp" else ("model",)))
    missing = [key for key in needed if not isinstance(state, dict) or key not in state]
    if missing:
        holds = ", ".join(sorted(map(str, state))[:6]) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{source} is not a normlab checkpoint: it lacks {', '.join(missing)} (it holds {holds}); torch's "
            "dcp_to_torch_save, for one, keeps the tensors alone. Give the run directory, or a .pt file or .dcp "
            "directory that train.py wrote"
        )


def read_header(path: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint ``read_checkpoint`` would read and its state, but with a .pt's tensors mapped from the file
    and a .dcp's shards checked against their metadata, not read: cheap enough to check every checkpoint a command
    names before it uses any."""
    path = Path(path)
    source = resolve_checkpoint(path)
    if source == path:
        state = load_checkpoint(source, mmap=True)
    else:
        source, state = load_newest_readable(path, mmap=True)
    check_normlab_state(state, source)
    return source, state


def read_checkpoint(path: Path) -> tuple[Path, dict[str, Any]]:
    """Any checkpoint, whole or sharded (a file, a .dcp directory, or a run directory's newest that reads, past
    damaged ones with a warning), with the whole model's weights under ``model``, read in this one process
    without a process group: what eval.py and scripts/export_hf.py need. Returns the checkpoint read and its
    state; the optimizer's state is not read."""
    path = Path(path)
    source = resolve_checkpoint(path)  # names what is missing when there is nothing to read
    if source == path:
        state = load_checkpoint(source)
    else:
        source, state = load_newest_readable(path)
    check_normlab_state(state, source)
    if source.suffix == ".dcp":
        reader = SafeReader(source)
        state["model"] = _dcp(
            f"read checkpoint {source}", lambda: _load_state_dict_from_keys({"model"}, storage_reader=reader)
        )["model"]
    return source, state


def save_sharded(
    run_dir: Path,
    header: dict[str, Any],
    model: nn.Module,
    optimizer,
    keep: int,
    dist: Distributed,
    unreadable: set[Path] | None = None,
) -> Path:
    """Every process writes its shards of ``model`` and ``optimizer``, rank 0 the ``header``; then rank 0 makes
    the checkpoint appear by a rename, and keeps the newest ``keep`` readable ones. A collective: every process
    calls it."""
    path = checkpoint_dir(run_dir) / f"step_{header['step']:07d}.dcp"
    tmp = path.with_name(f".{path.name}.tmp")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        header = {**header, "optimizer_param_groups": optimizer_state["param_groups"], "world_size": dist.world_size}
        atomic_write(tmp / HEADER, lambda file: torch.save(header, file))
    dist.barrier()
    shards = {"model": model_state, "optimizer": optimizer_state["state"]}
    _dcp(f"write checkpoint {path}", lambda: dcp.save(shards, storage_writer=FileSystemWriter(tmp)))
    if dist.is_main:  # dcp.save returns once rank 0 has written .metadata, after every process wrote its shards
        shutil.rmtree(path, ignore_errors=True)  # an unreadable one of the same step, which the resume passed over
        os.replace(tmp, path)
        unreadable = set() if unreadable is None else unreadable
        unreadable.discard(path)
        prune_checkpoints(run_dir, keep, frozenset(unreadable))
    return path


def is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def restore_into(source: Path, state: dict[str, Any], model: nn.Module, optimizer) -> None:
    """Load the checkpoint ``source`` (``state``: what ``load_checkpoint`` read of it) into ``model`` and its
    ``optimizer``, either of them sharded or whole."""
    if source.suffix == ".dcp":
        load_sharded(source, state, model, optimizer)
    elif is_sharded(model):
        load_whole(state, model, optimizer)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


def load_sharded(path: Path, header: dict[str, Any], model: nn.Module, optimizer) -> None:
    """Each process reads the slices of the sharded checkpoint ``path`` that its parameters and optimizer state
    hold (every slice, for a whole model), whatever number of processes wrote it."""
    # get_state_dict gives an optimizer without state a step at learning rate 0, so that its moments exist
    # to be read into (AdamW's weight decay is lr * decay: nothing moves); the checkpoint then replaces them.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state["state"]}
    reader = SafeReader(path)
    _dcp(
        f"read checkpoint {path} into this model",
        lambda: dcp.load(state, storage_reader=reader, no_dist=not is_sharded(model)),
    )
    groups = header["optimizer_param_groups"]
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict={"state": state["optimizer"], "param_groups": groups},
    )


def load_whole(state: dict[str, Any], model: nn.Module, optimizer) -> None:
    """A whole-model checkpoint (a ``.pt``, written by train.parallel=ddp or one process) into a sharded model
    and its optimizer: each process keeps its shards. The optimizer's state, saved by parameter position, is
    keyed by parameter name, the form torch.distributed.checkpoint.state_dict shards."""
    saved = state["optimizer"]
    if "state" not in saved:
        raise CheckpointError(
            "this checkpoint's optimizer is Muon's, which train.parallel=fsdp cannot shard: resume it with "
            "train.parallel=ddp"
        )
    name_of = {id(param): name for name, param in model.named_parameters()}
    names = [name_of[id(param)] for group in optimizer.param_groups for param in group["params"]]
    optimizer_state = {
        "state": {names[i]: values for i, values in saved["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in saved["param_groups"]],
    }
    options = StateDictOptions(full_state_dict=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=optimizer_state, options=options)
