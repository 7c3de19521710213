"""Checkpoint files, written: everything needed to continue a run exactly, atomically, and the newest kept.

A checkpoint holds the model and optimizer states, the step (which also fixes the data
position and the learning rate), every RNG state, the model config, the run config and the
tokenizer. Files are ``step_0000200.pt`` in ``<run dir>/checkpoints``; a file appears only
once complete (temp file, then rename), so a killed save leaves the previous one usable.
Everything in one is tensors and plain Python values (the NumPy RNG state, which NumPy hands out as an
array, as a tensor), so that it is read as data only (training/checkpoints/load.py).
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.atomic import atomic_write

log = logging.getLogger(__name__)
CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first: .pt files and sharded .dcp directories (a killed save's temp files are not)."""
    return sorted(path for path in checkpoint_dir(run_dir).glob("step_*") if path.suffix in (".pt", ".dcp"))


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete temp files that a save killed mid-write left behind (they were never checkpoints)."""
    for partial in checkpoint_dir(run_dir).glob(".step_*.tmp"):
        shutil.rmtree(partial) if partial.is_dir() else partial.unlink()


def prune_checkpoints(run_dir: Path, keep: int, unreadable: frozenset[Path] = frozenset()) -> None:
    """Keep the newest ``keep`` readable checkpoints (all of them for 0): those found ``unreadable`` (by a resume
    that fell back past them) do not count, and are removed once ``keep`` readable ones are newer."""
    found = list_checkpoints(run_dir)
    readable = [path for path in found if path not in unreadable]
    if keep <= 0 or len(readable) <= keep:
        return
    for old in found[: found.index(readable[-keep])]:
        shutil.rmtree(old) if old.is_dir() else old.unlink()


def rng_states() -> dict[str, Any]:
    """Every RNG state, as tensors and plain values (what the safe loader accepts)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def save_checkpoint(run_dir: Path, state: dict[str, Any], keep: int, unreadable: set[Path] | None = None) -> Path:
    """Write ``state`` as the checkpoint of ``state['step']``, then keep only the newest ``keep`` readable ones
    (``unreadable``: those a resume passed over, less the one just written in the place of one)."""
    path = checkpoint_dir(run_dir) / f"step_{state['step']:07d}.pt"
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    unreadable = set() if unreadable is None else unreadable
    unreadable.discard(path)
    prune_checkpoints(run_dir, keep, frozenset(unreadable))
    return path
