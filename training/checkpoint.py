"""Checkpoint files: everything needed to continue a run exactly, written atomically.

A checkpoint holds the model and optimizer states, the step (which also fixes the data
position and the learning rate), every RNG state, the model config, the run config and the
tokenizer. Files are ``step_0000200.pt`` in ``<run dir>/checkpoints``; a file appears only
once complete (temp file, then rename), so a killed save leaves the previous one usable.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.atomic import atomic_write

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here; the message says why and what to do."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temp files of an interrupted save are not listed)."""
    return sorted(checkpoint_dir(run_dir).glob("step_*.pt"))


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete temp files that a save killed mid-write left behind (they were never checkpoints)."""
    for partial in checkpoint_dir(run_dir).glob(".step_*.tmp"):
        partial.unlink()


def rng_states() -> dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(run_dir: Path, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``state['step']``, then keep only the newest ``keep``."""
    path = checkpoint_dir(run_dir) / f"step_{state['step']:07d}.pt"
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink()
    return path


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory."""
    path = Path(path)
    if path.is_file():
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"no checkpoint at {path}: expected a .pt file or a run directory with {CHECKPOINT_DIR}/step_*.pt"
        )
    return found[-1]


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = resolve_checkpoint(path)
    try:
        # Our own files hold RNG states and config dicts besides tensors, hence weights_only=False.
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:
        raise CheckpointError(
            f"could not read checkpoint {path}: {err}. Delete it to fall back to an older one."
        ) from err


def check_same_model(saved: dict[str, Any], current: dict[str, Any], source: Path) -> None:
    """Refuse a checkpoint whose model config differs from the one this code would build."""
    differences = {
        k: (saved.get(k), current.get(k)) for k in current.keys() | saved.keys() if saved.get(k) != current.get(k)
    }
    if differences:
        listed = "; ".join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in sorted(differences.items()))
        raise CheckpointError(
            f"checkpoint {source} was trained with another model config ({listed}). "
            "Use the same model/norm settings, or a new run directory (run_name=... or hydra.run.dir=...)."
        )
