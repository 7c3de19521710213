"""Checkpoints, read: as data only, past damaged ones, and checked against the run that would use them.

Every read uses ``torch.load(weights_only=True)``: a checkpoint someone sent you is data, never code.
Checkpoints written before the NumPy RNG state was a tensor hold a NumPy array, which is read by allowing
exactly NumPy's array reconstruction. Imported when a run has checkpoints to read, and by the readers.
"""

from __future__ import annotations

import logging
import pickle
import random
import zipfile
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.from_state import model_config_of
from training.checkpoints.files import CHECKPOINT_DIR, checkpoint_dir, list_checkpoints
from training.errors import CheckpointError, UnsafeCheckpointError, first_clause
from training.input_files import InputFileError, regular_file

log = logging.getLogger(__name__)


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    numpy_state = states["numpy"]
    if isinstance(numpy_state, dict):
        numpy_state = (
            numpy_state["name"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    np.random.set_state(numpy_state)  # a tuple: a checkpoint from before the tensor form
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory."""
    path = Path(path)
    if path.is_file() or (path.suffix == ".dcp" and path.is_dir()):
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"no checkpoint at {path}: expected a .pt file, a .dcp directory or a run directory with {CHECKPOINT_DIR}/"
        )
    return found[-1]


# What a checkpoint from before the tensor-form RNG state needs: NumPy's array reconstruction and
# nothing else (no function that could run code is among them).
_LEGACY_NUMPY_GLOBALS = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct,
]


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Read a checkpoint (a sharded one's header.pt) as data only: anything that would run code is refused.
    ``mmap``: the tensors are mapped from the file, not read (to check a checkpoint before using it)."""
    path = resolve_checkpoint(path)
    file = path / "header.pt" if path.is_dir() else path  # a sharded checkpoint's all but its shards
    try:
        regular_file(file, "a checkpoint")
        with torch.serialization.safe_globals(_LEGACY_NUMPY_GLOBALS):
            state = torch.load(
                file, map_location=map_location, weights_only=True, mmap=mmap and zipfile.is_zipfile(file)
            )
    except InputFileError as err:
        raise CheckpointError(f"could not read checkpoint {path}: {err}") from None
    except pickle.UnpicklingError as err:
        # The safe unpickler names the global (a class or function) it would have had to import.
        found = [line.strip() for line in str(err).splitlines() if "GLOBAL" in line]
        if not found:
            log.debug("torch.load(%s): %s", file, err)
            raise CheckpointError(
                f"could not read checkpoint {path}: it is damaged or not a torch checkpoint"
            ) from None
        raise UnsafeCheckpointError(
            f"refused to load {path}: it contains objects other than tensors and plain data, and unpickling "
            f"them could run arbitrary code ({found[0]}). normlab checkpoints never need that; "
            "only load this file with torch.load(weights_only=False) if you trust whoever made it."
        ) from None
    except Exception as err:
        log.debug("torch.load(%s): %s", file, err)
        raise CheckpointError(f"could not read checkpoint {path}: {first_clause(err)}") from None
    if path.is_dir():  # its shards too, before any is read: a damaged one is passed over like a damaged file
        from training.checkpoints.dcp_metadata import read_metadata

        read_metadata(path)
    return state


def load_newest_readable(
    run_dir: Path, map_location: str | torch.device = "cpu", unreadable: set[Path] | None = None, mmap: bool = False
) -> tuple[Path, dict] | None:
    """The newest checkpoint of ``run_dir`` that reads, falling back past damaged ones with a warning (each one
    passed over is added to ``unreadable``, which pruning then does not count).

    Returns None when the run has no checkpoint. If checkpoints exist but none reads, raises a one-line
    CheckpointError naming them: a run never silently starts over from step 0.
    """
    candidates = list_checkpoints(run_dir)
    failures = []
    for path in reversed(candidates):
        try:
            state = load_checkpoint(path, map_location, mmap)
        except CheckpointError as err:
            failures.append(str(err).removeprefix("could not read checkpoint "))
            if unreadable is not None:
                unreadable.add(path)
            continue
        if failures:
            log.warning("cannot read %s: using %s, the newest checkpoint that reads", "; ".join(failures), path)
        return path, state
    if failures:
        raise CheckpointError(
            f"none of the {len(candidates)} checkpoints in {checkpoint_dir(run_dir)} can be read ({'; '.join(failures)}): "
            "restore a copy that reads, or move them away to start this run over from step 0"
        )
    return None


def check_reachable(run_dir: Path, logged_step: int, first_checkpoint: int, last_step: int) -> None:
    """Refuse to go on with a run whose checkpoints cannot be reached, before anything is written: a run that
    logged past its first checkpoint (or its last step) had one, and starting it over from step 0 would cut its
    metrics. A ``checkpoints`` that is a file or a link to nothing is refused whatever was logged."""
    location = checkpoint_dir(run_dir)
    if location.is_symlink() and not location.exists():
        problem = f"is a link to {location.readlink()}, which does not exist"
    elif location.exists() and not location.is_dir():
        problem = "is a file, not a folder"
    elif (logged_step > first_checkpoint or logged_step >= last_step) and not list_checkpoints(run_dir):
        problem = "holds no checkpoint" if location.is_dir() else "is missing"
    else:
        return
    raise CheckpointError(
        f"{location} {problem}, but {run_dir} logged step {logged_step} (its first checkpoint was due at step "
        f"{first_checkpoint}): a run never starts over by itself. Restore its checkpoints, or to start over, "
        f"move {run_dir} away or train under another run_name=... Nothing in {run_dir} was changed."
    )


def config_differences(a, b, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Each field (dotted, nested dataclasses walked) where two configs of one class differ, with both values."""
    found = {}
    for f in fields(a):
        mine, theirs = getattr(a, f.name), getattr(b, f.name)
        if is_dataclass(mine):
            found.update(config_differences(mine, theirs, f"{prefix}{f.name}."))
        elif mine != theirs:
            found[f"{prefix}{f.name}"] = (mine, theirs)
    return found


def check_same_model(saved: dict[str, Any], current: dict[str, Any], source: Path) -> None:
    """Refuse a checkpoint whose model config differs from the one this code would build.

    Either is read as model/from_state.py reads them: an older checkpoint's layout, and fields added since it was
    written at their defaults, which are what the code that wrote it did (e.g. placement ``pre``).
    """
    differences = config_differences(*(model_config_of(config, str(source)) for config in (saved, current)))
    if differences:
        listed = "; ".join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in sorted(differences.items()))
        raise CheckpointError(
            f"checkpoint {source} was trained with another model config ({listed}). "
            "Use the same model/norm settings, or a new run directory (run_name=... or hydra.run.dir=...)."
        )
