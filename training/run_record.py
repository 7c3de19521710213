"""What identifies a run, and its record in ``<run dir>/config.yaml``.

A run directory holds one run. Its ``config.yaml`` is written once, when the run starts: the
resolved config and ``runtime:`` (what actually ran). Rerunning with the same configuration
resumes the run; a different one is refused before anything is written, unless the user
names the keys that may change (``resume_with_changes=[train.lr]``). Each resume appends an
entry to the record's ``resumes:`` list (time, step, what changed) and replaces nothing.

Keys in ``FREE_KEYS`` may change on resume because they do not change what the run computes
(logging, checkpointing, the device it runs on, the micro-batch when the global batch stays);
every other key, present or future, identifies the run. Two resolved values from ``runtime``
identify it too: the precision (``auto`` means bf16 on a GPU, fp32 elsewhere) and the global
batch in tokens.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from training.atomic import atomic_write_text
from training.checkpoint import first_clause, load_newest_readable
from training.errors import NormlabError
from training.input_files import InputFileError, MiB, read_text
from training.run_lock import LOCK_FILE

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
RESOLVED_RUNTIME_KEYS = ("precision", "global_batch_tokens")
# Keys that records written by older code carry and the schema no longer has: a study's claims and
# plan (now its spec, configs/study/). They never described what a run computes, so they are ignored.
RETIRED_KEYS = ("claims", "study_plan")

# Why a changed key matters, where it is not obvious.
_WHY = {
    "train.max_steps": "the cosine schedule spans max_steps, so changing it changes the learning rate of every step "
    "from step 0 on: the steps already taken followed another schedule",
}


class RunIdentityError(NormlabError, ValueError):
    """The run directory holds a run of another configuration; the message says what differs."""


def is_free(key: str) -> bool:
    return any(key == free or key.startswith(free + ".") for free in FREE_KEYS)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}``; lists stay values."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def identity(run_config: dict) -> dict[str, Any]:
    """The keys and values that define a run, from a config dict with its ``runtime`` section."""
    body = {k: v for k, v in run_config.items() if k not in ("runtime", "resumes", *RETIRED_KEYS)}
    keys = {k: v for k, v in flatten(body).items() if not is_free(k)}
    runtime = run_config.get("runtime") or {}
    keys.update({f"runtime.{k}": runtime.get(k) for k in RESOLVED_RUNTIME_KEYS})
    return keys


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


def effective_config(record: dict) -> dict:
    """The record's config with every accepted resume change applied, oldest first."""
    flat = flatten({k: v for k, v in record.items() if k != "resumes"})
    for resume in record.get("resumes") or []:
        flat.update({key: change["now"] for key, change in (resume.get("changes") or {}).items()})
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def _changes(recorded: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any]) -> dict[str, dict]:
    """Keys whose value differs; a key the record lacks (older code) counts at its schema default."""
    missing = object()
    changes = {}
    for key in sorted(recorded.keys() | current.keys()):
        was = recorded.get(key, defaults.get(key, missing))
        now = current.get(key, missing)
        if was != now:
            changes[key] = {"was": None if was is missing else was, "now": None if now is missing else now}
    return changes


def find_record(run_dir: Path) -> tuple[dict, Path] | None:
    """The run's record and where it was read: config.yaml, or where that is gone, the newest readable
    checkpoint's copy (every checkpoint carries the record, so it is the record of last resort)."""
    record = read_record(run_dir)
    if record is not None:
        return record, Path(run_dir) / RECORD
    found = load_newest_readable(run_dir)
    if found is None or not found[1].get("config"):
        return None
    return found[1]["config"], found[0]


def check_resume(run_dir: Path, run_config: dict, schema_defaults: dict, allowed: list[str]) -> dict | None:
    """Compare ``run_config`` with the run recorded in ``run_dir`` (``find_record``); raise if it is another run.

    Returns None for a new run directory, else the resume entry to append (the changed keys,
    free ones included, with both values; the record and its source when it came from a checkpoint, and
    the recorded data fingerprint, which the data is checked against once loaded).
    """
    found = find_record(run_dir)
    if found is None:
        return None
    record, path = found
    recorded = effective_config(record)
    unknown = sorted(key for key in allowed if key not in flatten(run_config) and key not in flatten(recorded))
    if unknown:
        raise RunIdentityError(
            f"resume_with_changes names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not a "
            "config key; give dotted keys such as train.lr"
        )
    defaults = flatten(schema_defaults)
    identity_changes = _changes(identity(recorded), identity(run_config), defaults)
    refused = {k: v for k, v in identity_changes.items() if k not in allowed}
    if refused:
        lines = [f"  {key}: {change['was']!r} in {path} vs {change['now']!r} now" for key, change in refused.items()]
        lines += [f"  ({key}: {_WHY[key]})" for key in refused if key in _WHY]
        keys = ",".join(refused)
        raise RunIdentityError(
            f"{run_dir} holds a run with another configuration, and a run directory holds one run:\n"
            + "\n".join(lines)
            + f"\nTo start a separate run, give it another name: run_name=... (or hydra.run.dir=...). To continue "
            f"this run with the new values anyway, add 'resume_with_changes=[{keys}]'; the change is then recorded "
            f"in {Path(run_dir) / RECORD} under resumes. Nothing in {run_dir} was changed."
        )
    runtime = record.get("runtime") or {}
    entry = {
        "changes": _changes(_recorded_keys(recorded), _recorded_keys(run_config), defaults),
        "data_fingerprint": runtime.get("data_fingerprint"),
        "vocab_size": runtime.get("vocab_size"),  # the embedding rows it trained with (padded as its source was)
    }
    if path.name != RECORD:
        entry.update(restored_record=record, record_source=str(path))
    return entry


def check_same_data(entry: dict, fingerprint: dict, run_dir: Path) -> None:
    """Refuse to resume on data whose text changed since the run started (a corpus file edited, another split),
    whatever the tokenizer: the recorded fingerprint (runs recorded before it have none) against the loaded one."""
    recorded = entry.get("data_fingerprint")
    changed = sorted(k for k in (recorded or {}) if recorded[k] != fingerprint.get(k))
    if changed:
        raise RunIdentityError(
            f"the data of {run_dir} changed since the run started ({', '.join(changed)} split: its files or "
            "settings differ from the recorded fingerprint), and a run trains on one corpus. Restore the files, "
            f"or train a separate run on the new data (run_name=...). Nothing in {run_dir} was changed."
        )


def _recorded_keys(config: dict) -> dict[str, Any]:
    """Every config key worth noting in a resume entry (not runtime, not the permission itself)."""
    body = {k: v for k, v in config.items() if k not in ("runtime", "resumes", "resume_with_changes", *RETIRED_KEYS)}
    return flatten(body)


def write_new_record(run_dir: Path, run_config: dict) -> None:
    atomic_write_text(Path(run_dir) / RECORD, yaml.safe_dump(run_config, sort_keys=False))


def append_resume(run_dir: Path, entry: dict, runtime: dict) -> None:
    """Add one entry (``step``, ``checkpoint``, ``changes``) to the record's ``resumes:`` list.

    The rest of the file stays as it was.
    """
    record = read_record(run_dir) or entry["restored_record"]  # config.yaml gone: the checkpoint's copy
    resume = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "step": entry["step"],
        "checkpoint": entry["checkpoint"],
        "changes": entry["changes"],
        "runtime": {k: runtime[k] for k in ("device", "world_size", "norm_backend", "grad_accum") if k in runtime},
    }
    if "record_source" in entry:
        resume["record_restored_from"] = entry["record_source"]
    record.setdefault("resumes", []).append(resume)
    atomic_write_text(Path(run_dir) / RECORD, yaml.safe_dump(record, sort_keys=False))


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
    training/variant.py) and ``${overrides_tag:}`` (this process's Hydra overrides; "" outside Hydra)."""

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
