"""Sharded checkpoints (``train.parallel=fsdp``): each process writes its own shards, any number of processes
(or none: eval.py, scripts/export_hf.py) reads them. Imported only when such a checkpoint is written or read.

A checkpoint is a directory ``checkpoints/step_0000200.dcp`` holding

- ``header.pt``: everything but the weights and the optimizer's moments (the step, the RNG states, the model
  and run configs, the tokenizer, the optimizer's param groups), written by rank 0 with ``torch.save`` and
  read with ``weights_only=True`` like every checkpoint of ours (training/checkpoint.py);
- ``torch.distributed.checkpoint``'s files (``.metadata``, ``__<rank>_0.distcp``): tensors only, keyed by
  parameter name (``model.layers.0.attn.qkv_proj.weight``, ``optimizer.layers.0.attn.qkv_proj.weight.exp_avg``)
  with their global shapes, so a run on another number of processes reads the slices it holds.

It is written to ``.step_0000200.dcp.tmp`` and renamed once every process has written its part, so a save
killed midway leaves the previous checkpoint in charge, as with ``.pt`` files. DCP reads its ``.metadata``
with ``pickle``, which can run code; here an unpickler that rebuilds DCP's metadata classes, torch sizes and
dtypes and nothing else reads it, and a checkpoint that holds anything but tensors is refused (DCP would
unpickle those too).

Either parallel mode reads the other's checkpoints: a sharded model loads a whole ``.pt`` (each process keeps
its shard), and a whole model loads a ``.dcp`` (each process reads every shard).
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
from torch.distributed.tensor import DTensor

from training.atomic import atomic_write
from training.checkpoint import (
    CheckpointError,
    UnsafeCheckpointError,
    checkpoint_dir,
    load_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
)
from training.distributed import Distributed

HEADER = "header.pt"  # training/checkpoint.py reads it as a .dcp checkpoint's state
# One process reading or writing every shard (no torchrun, or a whole model) is what we mean when DCP says this.
warnings.filterwarnings("ignore", message="torch.distributed is .*uninitialized, assuming the intent is to")
# What DCP's metadata is made of (module -> names); torch dtypes are admitted by type.
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": None,  # any of its classes: plain dataclasses and an enum
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},  # a layout by its name, e.g. torch.strided
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},  # where it was written
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = _METADATA_GLOBALS.get(module, set())
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if module in _METADATA_GLOBALS and (allowed is None or name in allowed) or dtype:
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"refused to read {self.path}: it names {module}.{name}, which torch.distributed.checkpoint's metadata "
            "never holds, and unpickling it could run code; only read it with torch.distributed.checkpoint "
            "itself if you trust whoever made it"
        )


class SafeReader(FileSystemReader):
    """DCP's file reader, its metadata read as data only, and only checkpoints of tensors accepted."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as f:
                unpickler = _MetadataUnpickler(f)
                unpickler.path = path
                metadata = unpickler.load()
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"could not read checkpoint {self.path}: {path.name} is damaged ({err})") from None
        others = sorted(k for k, v in metadata.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata))
        if others:
            raise UnsafeCheckpointError(
                f"refused to read {self.path}: it holds non-tensor entries ({', '.join(others[:3])}), which "
                "torch.distributed.checkpoint would unpickle; normlab's sharded checkpoints hold tensors only"
            )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Any checkpoint, whole or sharded (a file, a .dcp directory or a run directory's newest), with the whole
    model's weights under ``model``, read in this one process without a process group: what eval.py and
    scripts/export_hf.py need. The optimizer's state is not read."""
    path = resolve_checkpoint(path)
    state = load_checkpoint(path)
    if path.suffix == ".dcp":
        SafeReader(path).read_metadata()  # refuses what is not tensors, in a message of its own
        state["model"] = _load_state_dict_from_keys({"model"}, storage_reader=SafeReader(path))["model"]
    return state


def save_sharded(
    run_dir: Path, header: dict[str, Any], model: nn.Module, optimizer, keep: int, dist: Distributed
) -> Path:
    """Every process writes its shards of ``model`` and ``optimizer``, rank 0 the ``header``; then rank 0 makes
    the checkpoint appear by a rename, and keeps the newest ``keep``. A collective: every process calls it."""
    path = checkpoint_dir(run_dir) / f"step_{header['step']:07d}.dcp"
    tmp = path.with_name(f".{path.name}.tmp")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        header = {**header, "optimizer_param_groups": optimizer_state["param_groups"], "world_size": dist.world_size}
        atomic_write(tmp / HEADER, lambda file: torch.save(header, file))
    dist.barrier()
    dcp.save({"model": model_state, "optimizer": optimizer_state["state"]}, storage_writer=FileSystemWriter(tmp))
    if dist.is_main:  # dcp.save returns once rank 0 has written .metadata, after every process wrote its shards
        shutil.rmtree(path, ignore_errors=True)  # an unreadable one of the same step, which the resume passed over
        os.replace(tmp, path)
        prune_checkpoints(run_dir, keep)
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
    SafeReader(path).read_metadata()  # refuses what is not tensors, in a message of its own
    try:
        dcp.load(state, storage_reader=SafeReader(path), no_dist=not is_sharded(model))
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"could not read checkpoint {path} into this model: {err}") from None
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
