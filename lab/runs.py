"""Run directories as ``Run`` objects: their config, their metrics rows, their status, their groups.

A run directory holds the config.yaml, metrics.jsonl and tokenizer.json that train.py writes;
a sweep directory holds run directories (at any depth). A model imported by scripts/import_hf.py
(``runtime.imported_from`` in its config) has no metrics until it trains: its one row is what eval.py
measured at step 0 (its eval.json).
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from training.run.record import is_free
from training.run.resume import flatten
from training.telemetry.metrics_file import MetricsFileError, diverged_step, read_metrics

# The variant every comparison is made against unless told otherwise.
BASELINE = "rmsnorm"
# Grouping by this "key" groups by every config key the runs differ in except the seed, so runs
# of different learning rates (or models, or steps) are never pooled as if they were seeds.
SWEPT = "swept"
IMPORTED = "imported: "  # the label an imported model's group starts with (it did not train here)


class RunsError(ValueError):
    """Runs that cannot be compared as asked; the message says why and what to do."""


@dataclass
class Run:
    path: Path
    config: dict
    rows: list[dict]
    tokenizer_hash: str
    torn_tail: bool = False  # the last line of metrics.jsonl was cut off (a run being written, or killed mid-line)

    def lookup(self, dotted: str):
        value = self.config
        for part in dotted.split("."):
            if not isinstance(value, dict) or part not in value:
                keys = sorted(k for k in flatten(self.config) if not k.startswith(("runtime.", "resumes")))
                raise RunsError(
                    f"{self.path}/config.yaml has no key {dotted!r} to group by; its keys: {', '.join(keys)}"
                )
            value = value[part]
        return value

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in self.rows if isinstance(r.get(key), (int, float))]

    def last(self, key: str) -> float | None:
        points = self.series(key)
        return points[-1][1] if points else None

    def median(self, key: str) -> float | None:
        points = self.series(key)
        return statistics.median(v for _, v in points) if points else None

    @property
    def imported_from(self) -> dict | None:
        """The folder, architecture and dtype of a model imported by scripts/import_hf.py; None for one trained here."""
        return (self.config.get("runtime") or {}).get("imported_from")

    @property
    def evaluated_only(self) -> bool:
        """An imported model that has not trained here: its one row is its evaluation (eval.json)."""
        return bool(self.imported_from) and not (self.path / "metrics.jsonl").exists()

    def by_layer(self, template: str, step: int | None = None) -> list[float]:
        """``template`` (e.g. ``act/layers.{i}/stream_rms``) for layers 0, 1, ..., from the last row that
        logged layer 0 at or before ``step`` (default: the last such row)."""
        for row in reversed(self.rows):
            if template.format(i=0) in row and (step is None or row["step"] <= step):
                return layer_values(row, template)
        return []

    @property
    def diverged_at(self) -> int | None:
        return diverged_step(self.rows)

    @property
    def unfinished(self) -> bool:
        """Stopped before train.max_steps without diverging: still training, or interrupted."""
        max_steps = self.config.get("train", {}).get("max_steps")
        last = self.rows[-1].get("step", 0) if self.rows else 0
        return self.diverged_at is None and max_steps is not None and last < max_steps

    def status(self) -> str:
        """finished, diverged at step N, or the steps logged so far (still training, or stopped)."""
        step = self.rows[-1].get("step", 0)
        if self.diverged_at is not None:
            return f"diverged at step {step}"
        if self.imported_from and step == 0:
            return f"imported ({self.imported_from.get('architecture')}), not trained here"
        max_steps = self.config.get("train", {}).get("max_steps")
        return "finished" if step == max_steps else f"step {step} of {max_steps} (still training, or stopped)"


def layer_values(row: dict, template: str) -> list[float]:
    """``template`` for layers 0, 1, ... as far as ``row`` logged them."""
    values = []
    while template.format(i=len(values)) in row:
        values.append(row[template.format(i=len(values))])
    return values


def load_run(path: Path) -> Run:
    tokenizer = path / "tokenizer.json"
    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest() if tokenizer.exists() else "unknown"
    try:
        config = yaml.safe_load((path / "config.yaml").read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise RunsError(f"{path}/config.yaml cannot be read ({type(err).__name__}); the run is left out") from None
    if not isinstance(config, dict) or not isinstance(config.get("norm"), dict):
        raise RunsError(f"{path}/config.yaml is not a run record (no norm section); the run is left out")
    config.setdefault("variant", config["norm"]["name"])  # runs from before placements: the norm was the variant
    run = Run(path, config, [], digest)
    if run.evaluated_only:
        run.rows = _evaluated_rows(run)
        return run
    try:
        metrics = read_metrics(path / "metrics.jsonl")
    except MetricsFileError as err:
        raise RunsError(str(err)) from None
    if not metrics.rows:
        raise RunsError(f"run {path} has no metrics (metrics.jsonl is missing or empty); did its training start?")
    run.rows, run.torn_tail = metrics.rows, metrics.torn_tail
    return run


def _evaluated_rows(run: Run) -> list[dict]:
    """An imported run's one row: the numbers of its newest evaluation on its own data, as a metrics row."""
    try:
        evaluation = latest_eval(run)
    except (OSError, ValueError) as err:  # a damaged or unreadable eval.json
        raise RunsError(
            f"{run.path}/eval.json cannot be read ({type(err).__name__}: {err}); the run is left out"
        ) from None
    if evaluation is None:
        raise RunsError(
            f"{run.path} was imported ({run.imported_from.get('architecture')}) and has no evaluation on its own data "
            f"yet: run python eval.py checkpoint={run.path}"
        )
    return [{key: value for key, value in evaluation.items() if isinstance(value, (int, float))}]


def find_runs(inputs: list[str]) -> list[Run]:
    """Every run (config.yaml and metrics.jsonl) at or under the given paths and globs; one that cannot be read
    is an error naming it."""
    return [load_run(p) for p in find_run_dirs(inputs)]


def readable_runs(inputs: list[str]) -> tuple[list[Run], list[str]]:
    """The runs at or under ``inputs`` that load, and a line naming each that does not (it is left out);
    none readable is an error."""
    runs, skipped = load_runs(inputs)
    if not runs:
        raise RunsError("no readable run under " + ", ".join(inputs) + "".join(f"\n  {line}" for line in skipped))
    return runs, skipped


def load_runs(inputs: list[str]) -> tuple[list[Run], list[str]]:
    """The runs at or under ``inputs`` that load, and a message for each that does not (a run
    started but with nothing logged yet, a damaged metrics file)."""
    runs, skipped = [], []
    for path in find_run_dirs(inputs):
        try:
            runs.append(load_run(path))
        except RunsError as err:
            skipped.append(str(err))
    return runs, skipped


def find_run_dirs(inputs: list[str]) -> list[Path]:
    """Every run directory (one holding config.yaml) at or under the given paths and globs."""
    found: set[Path] = set()
    for pattern in inputs:
        matches = [Path(p) for p in sorted(glob.glob(pattern))]
        if not matches:
            raise RunsError(f"{pattern!r} matches nothing")
        for path in matches:
            if (path / "config.yaml").exists():
                found.add(path)
            elif path.is_dir():
                found.update(p.parent for p in path.rglob("config.yaml") if p.parent.name != ".hydra")
    if not found:
        raise RunsError(
            f"no runs found under {', '.join(inputs)}: a run directory holds the config.yaml and "
            "metrics.jsonl that train.py writes"
        )
    return sorted(found)


def check_comparable(runs: list[Run], metric: str) -> None:
    """Refuse a metric no run logged (listing the ones they did), and losses over different tokenizers."""
    if not any(metric in row for r in runs for row in r.rows):
        logged = sorted({k for r in runs for row in r.rows for k in row if "/" in k and "{" not in k})
        shown = [k for k in logged if not k.startswith(("act/", "attn/", "grad/"))] or logged
        raise RunsError(f"no run logged the metric {metric!r}; they logged: {', '.join(shown)}")
    if metric.endswith("/loss") and len({r.tokenizer_hash for r in runs}) > 1:
        raise RunsError(
            "these runs use different tokenizers, so their losses are per token of different vocabularies "
            "and do not compare. Compare bits per byte instead: --metric val/bpb"
        )


def swept_keys(runs: list[Run]) -> list[str]:
    """The config keys whose values differ between the runs and that change what a run computes
    (not the seed, nor a free key such as logging intervals; not ``runtime`` or ``resumes``), that
    the variant label does not already tell apart. Read from the runs that trained where there are any: an
    imported model beside its fine-tunes differs from them in every training key, and would name them all."""
    trained = [r for r in runs if not r.evaluated_only] or runs
    flat = [{k: v for k, v in flatten(r.config).items() if not k.startswith(("runtime.", "resumes"))} for r in trained]
    keys = sorted({k for f in flat for k in f if not is_free(k) and k != "seed"})
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
    by_label = defaultdict(list)
    for f in flat:
        by_label[f.get("variant")].append(f)
    return [k for k in differ if any(len({repr(f.get(k)) for f in group}) > 1 for group in by_label.values())]


def group_runs(runs: list[Run], group_by: str) -> dict[str, list[Run]]:
    """Runs by the value of a dotted config key, sorted by that value's text. ``SWEPT``: by the
    variant and every other swept key (``rmsnorm, train.lr=0.01``); an imported model that did not train here
    is a group of its own (``imported: <run>``, IMPORTED)."""
    extra = swept_keys(runs) if group_by == SWEPT else []
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if group_by == SWEPT and run.evaluated_only:
            groups[f"{IMPORTED}{run.path.name}"].append(run)
            continue
        label = str(run.lookup("variant" if group_by == SWEPT else group_by))
        label += "".join(f", {key}={flatten(run.config).get(key)}" for key in extra)
        groups[label].append(run)
    return dict(sorted(groups.items()))


def loss_ceiling(runs: list[Run]) -> float | None:
    """The top of a loss axis: 1.25 x the largest initial loss ln(vocabulary) of the runs, so one run
    that blew up (a loss of 1e30 before its NaN) does not squeeze every other curve flat."""
    sizes = [r.config.get("runtime", {}).get("vocab_size") for r in runs]
    return 1.25 * math.log(max(sizes)) if sizes and all(sizes) else None


def on_own_data(entry: dict, run: Run) -> bool:
    """Whether an eval.json entry measured the run's own validation data: the same split's text (its
    fingerprint, where both record one; else the data config's name) and the same number of windows."""
    data = run.config.get("data") or {}
    own = ((run.config.get("runtime") or {}).get("data_fingerprint") or {}).get("val")
    measured = entry.get("data_fingerprint")
    same_text = (
        measured.rsplit("|tokenizer ", 1)[0] == own if own and measured else entry.get("data") == data.get("name")
    )
    return same_text and entry.get("val_windows", data.get("val_windows")) == data.get("val_windows")


def read_evaluations(path: Path) -> dict[str, dict]:
    """The evaluations an eval.json holds, by key; a ValueError saying why where it holds none (eval.py, which
    merges into it, and the readers read it alike)."""
    try:
        evaluations = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not UTF-8, or not JSON
        raise ValueError(f"is not JSON ({err})") from None
    if not isinstance(evaluations, dict) or not all(isinstance(e, dict) for e in evaluations.values()):
        raise ValueError("holds no evaluations (a JSON object of objects, as eval.py writes)")
    return evaluations


def latest_eval(run: Run) -> dict | None:
    """The newest checkpoint's entry in the run's eval.json (what eval.py wrote) on the run's own data, or None:
    an evaluation on another corpus or window count sits beside it and is never read as the run's. Of two
    entries of one checkpoint, the one whose probes read the validation batch (not a ``probe_text``) is read."""
    path = run.path / "eval.json"
    if not path.is_file():
        return None
    entries = [e for e in read_evaluations(path).values() if on_own_data(e, run)]
    return max(entries, key=lambda e: (e["step"], "probe_text" not in e), default=None)


def default_baseline(groups) -> str:
    """``BASELINE`` when it is one of the groups (or the first group of its variant, when the groups
    are labelled by swept keys too), else the first group that trained (an imported model is no baseline while
    runs that trained are there)."""
    if BASELINE in groups:
        return BASELINE
    trained = [g for g in groups if not g.startswith(IMPORTED)] or list(groups)
    return next((g for g in trained if g.startswith(BASELINE + ", ")), trained[0])


def show_report(command: str, write: Callable[[], Path], out: Path) -> int:
    """How a report command ends: write the report, print it and where it went; a RunsError (no runs, a
    missing baseline, mixed tokenizers) is the user's to fix, so it is one line and exit status 1."""
    if out.exists() and not out.is_dir():
        print(
            f"lab {command}: --out {out} is a file; give a folder for the report (it is created if missing)",
            file=sys.stderr,
        )
        return 1
    try:
        path = write()
    except RunsError as err:
        print(f"lab {command}: {err}", file=sys.stderr)
        return 1
    print(path.read_text())
    print(f"wrote {out}")
    return 0
