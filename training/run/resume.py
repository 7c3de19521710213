"""Rerunning a run's command resumes it: the rerun's config compared with the run's record, and the resume noted.

Rerunning with the same configuration resumes the run; a different one is refused before anything is written,
unless the user names the keys that may change (``resume_with_changes=[train.lr]``). Each resume appends an
entry to the record's ``resumes:`` list (time, step, what changed) and replaces nothing. Besides the keys that
are not free (training/run/record.py), two resolved values from ``runtime`` identify a run: the precision
(``auto`` means bf16 on a GPU, fp32 elsewhere) and the global batch in tokens. Imported when a run has a record.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Any

import yaml

from training.atomic import atomic_write_text
from training.checkpoints.load import check_reachable, check_same_model, load_newest_readable, restore_rng_states
from training.errors import CheckpointError
from training.run.record import RECORD, RunIdentityError, is_free, read_record
from training.telemetry.metrics_file import diverged_step, read_metrics

log = logging.getLogger("normlab.train")

RESOLVED_RUNTIME_KEYS = ("precision", "global_batch_tokens")
# Keys that records written by older code carry and the schema no longer has: a study's claims and
# plan (now its spec, configs/study/). They never described what a run computes, so they are ignored.
RETIRED_KEYS = ("claims", "study_plan")

# Why a changed key matters, where it is not obvious.
_WHY = {
    "train.max_steps": "the cosine schedule spans max_steps, so changing it changes the learning rate of every step "
    "from step 0 on: the steps already taken followed another schedule",
}


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


def diverged(cfg, run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` diverged: that is its result, and a rerun has nothing to train unless it
    resumes with changes. Otherwise its checkpoints must reach the steps it logged (else it is refused)."""
    rows = read_metrics(run_dir / "metrics.jsonl", damaged="skip").rows
    diverged_at = diverged_step(rows)
    if diverged_at is not None and not cfg.resume_with_changes:
        log.info("%s diverged at step %d: that is its result, nothing to train", run_dir, diverged_at)
        return True
    logged = max((row["step"] for row in rows), default=0)
    tcfg = cfg.train
    check_reachable(run_dir, logged, min(tcfg.checkpoint_every, tcfg.max_steps), tcfg.max_steps)
    return False


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


def restore(run_dir: Path, model, optimizer, model_cfg, tokenizer, sharded: bool, unreadable: set[Path]):
    """Load the newest readable checkpoint of ``run_dir`` into the model and its optimizer (those passed over are
    added to ``unreadable``), refusing one of another model or tokenizer; the RNG states come back with it.

    Returns (its step, its path, the training seconds before this process).
    """
    # Read into host memory: the RNG states must be CPU tensors (torch.set_rng_state refuses CUDA ones, which is
    # what reading onto a GPU model's device gave them), and load_state_dict copies the rest to where it belongs.
    source, state = load_newest_readable(run_dir, "cpu", unreadable)
    check_same_model(state["model_config"], model_cfg.to_dict(), source)
    if state["tokenizer"] != tokenizer.to_str():
        raise CheckpointError(
            f"{source} was trained with another tokenizer than the data settings now give; use the same data "
            "settings, or a new run directory (run_name=...)"
        )
    if source.suffix == ".dcp" or sharded:  # shards in, or out (training/checkpoints/sharded.py)
        from training.checkpoints.sharded import restore_into

        restore_into(source, state, model, optimizer)
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    restore_rng_states(state["rng"])
    return state["step"], source, state["elapsed_s"]
