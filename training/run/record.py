"""A run's record in ``<run dir>/config.yaml``, its directory's files, and what names it.

A run directory holds one run. Its ``config.yaml`` is written once, when the run starts: the
resolved config and ``runtime:`` (what actually ran); a rerun is compared with it
(training/run/resume.py). Keys in ``FREE_KEYS`` may change on resume because they do not change what
the run computes (logging, checkpointing, the device it runs on, the micro-batch when the global batch
stays); every other key, present or future, identifies the run, and names it apart (``overrides_tag``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from training.atomic import atomic_write_text
from training.errors import NormlabError, first_clause
from training.input_files import InputFileError, MiB, read_text
from training.run.lock import LOCK_FILE

RECORD = "config.yaml"

FREE_KEYS = (
    "run_name",
    "variant",  # a label derived from the norm keys
    "resume_with_changes",
    "device",
    "cpu_threads",
    "logger",
    "data.cache_dir",
    "train.log_every",
    "train.eval_every",
    "train.stats_every",
    "train.probes",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.perf_warmup_steps",
    "train.peak_flops",
    "train.dist_timeout_s",
    "train.compile",
    # The global batch (runtime.global_batch_tokens) is compared instead: with it fixed, the
    # micro-batch and the process count only change how the same batch is split.
    "train.batch_size",
    "train.global_batch_tokens",
    "train.precision",  # compared resolved, as runtime.precision
    "train.parallel",  # like the process count: FSDP's losses are DDP's to float rounding (tests/e2e/test_fsdp.py)
    "model.vocab_size",  # the embedding rows are compared as the checkpoint's model config (runtime.vocab_size)
)


class RunIdentityError(NormlabError, ValueError):
    """The run directory holds a run of another configuration; the message says what differs."""


def is_free(key: str) -> bool:
    return any(key == free or key.startswith(free + ".") for free in FREE_KEYS)


# The files a run writes in its directory: never through a link, which would have it write outside the run.
# (``checkpoints`` may be a link, to keep them on another disk: it is a folder the run writes into.)
RUN_FILES = (RECORD, "metrics.jsonl", "tokenizer.json", "train.log", "eval.json", "wandb_id.txt", ".hydra", LOCK_FILE)


def check_run_directory(run_dir: Path) -> None:
    """Refuse a folder that holds files but no run of ours (no record, no checkpoints), naming what it holds, and
    a run whose files are links: either is left as it is."""
    run_dir = Path(run_dir)
    links = [name for name in RUN_FILES if (run_dir / name).is_symlink()]
    if links:
        raise RunIdentityError(
            f"{run_dir / links[0]} is a link to {(run_dir / links[0]).readlink()}; a run writes its files only "
            f"inside its directory, never through a link: replace it with the file itself. Nothing was changed."
        )
    if not run_dir.is_dir() or (run_dir / RECORD).is_file() or (run_dir / "checkpoints").is_dir():
        return
    found = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE)
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise RunIdentityError(
            f"{run_dir} is not a normlab run directory: it holds {shown} but no {RECORD} and no checkpoints. "
            "Train elsewhere (run_name=... or hydra.run.dir=...), or move those files away. Nothing in it was changed."
        )


RECORD_LIMIT = 64 * MiB  # a record is a few kilobytes, and grows by one entry a resume


def read_record(run_dir: Path) -> dict | None:
    path = Path(run_dir) / RECORD
    if not path.exists():
        return None
    try:
        record = yaml.safe_load(read_text(path, RECORD_LIMIT, "a run's record"))
    except InputFileError as err:
        raise RunIdentityError(f"{err}; move it away or use another run_name") from None
    except yaml.YAMLError as err:
        raise RunIdentityError(
            f"{path} is not YAML ({first_clause(err)}); move it away or use another run_name"
        ) from None
    if not isinstance(record, dict):
        raise RunIdentityError(f"{path} is not a run record (a YAML mapping); move it away or use another run_name")
    return record


def write_new_record(run_dir: Path, run_config: dict) -> None:
    atomic_write_text(Path(run_dir) / RECORD, yaml.safe_dump(run_config, sort_keys=False))


def overrides_tag(overrides: list[str], readable_keys: tuple[str, ...]) -> str:
    """``-h<6 hex>`` from the command-line overrides not already in the readable run name, or "".

    Two commands that differ in what they compute get different run names (so they never meet
    in one directory by accident); the same command gets the same name, so it finds its run.
    Overrides of keys that may change on resume do not split runs.
    """
    kept = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in readable_keys or is_free(key) or key.startswith("hydra."):
            continue
        kept.append(override.lstrip("+"))
    if not kept:
        return ""
    return "-h" + hashlib.sha1("\n".join(sorted(kept)).encode()).hexdigest()[:6]


def register_run_name_resolvers(readable_keys: tuple[str, ...], label: Callable[[Callable[[str], Any]], str]) -> None:
    """``${norm_variant:}`` (the label of the config it sits in: ``label`` of a lookup of its keys,
    training/run/label.py) and ``${overrides_tag:}`` (this process's Hydra overrides; "" outside Hydra)."""

    def resolve_overrides_tag() -> str:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return ""
        return overrides_tag(list(HydraConfig.get().overrides.task), readable_keys)

    if not OmegaConf.has_resolver("overrides_tag"):
        OmegaConf.register_new_resolver("overrides_tag", resolve_overrides_tag)
        OmegaConf.register_new_resolver(
            "norm_variant", lambda *, _root_: label(lambda key: OmegaConf.select(_root_, key))
        )
