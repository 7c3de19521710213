"""``metrics.jsonl``, written and read here: one JSON object per logged step.

Training appends a row per logged step and flushes it, so a reader can meet a last line that is
still being written (or was cut off by a kill). Analyses refuse any other unreadable line
(the file is damaged); training's own checks (resume, divergence) skip every unreadable line,
since they must work on whatever a killed run left.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from training.atomic import atomic_write_text
from training.errors import NormlabError


class MetricsFileError(NormlabError, ValueError):
    """A metrics.jsonl damaged in the middle; the message names the file and the line."""


@dataclass
class Metrics:
    rows: list[dict]
    torn_tail: bool  # the last line was cut off (a run being written, or killed mid-line) and left out


def read_metrics(path: Path, damaged: Literal["raise", "skip"] = "raise") -> Metrics:
    """The rows of ``path`` (none if it does not exist).

    ``damaged="raise"`` refuses an unreadable line anywhere but last; ``"skip"`` leaves every
    unreadable line out, and rows without a ``step`` too.
    """
    path = Path(path)
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    rows, torn = [], False
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                torn = True
            elif damaged == "raise":
                raise MetricsFileError(
                    f"{path} line {number} is not JSON: the file is damaged; move the run aside"
                ) from None
            continue
        if damaged == "skip" and not (isinstance(row, dict) and "step" in row):
            continue
        rows.append(row)
    return Metrics(rows, torn)


def diverged_step(rows: list[dict]) -> int | None:
    """The step at which the rows record a divergence (``train.nan_policy=record``), if any."""
    return next((row["step"] for row in rows if row.get("diverged")), None)


class MetricsFile:
    """One JSON object per logged step, appended and flushed as it goes."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            self._drop_rows_after(resume_step)
        self.file = open(self.path, "a", encoding="utf-8")  # closed in close()

    def _drop_rows_after(self, step: int) -> None:
        """Rows logged after the checkpoint being resumed are superseded by the resumed run.

        A half-written last line (the process was killed mid-write) is dropped too. The file
        is replaced atomically, so a kill now loses nothing.
        """
        kept = [row for row in read_metrics(self.path, damaged="skip").rows if row["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(row) + "\n" for row in kept))

    def log(self, metrics: dict[str, Any]) -> None:
        row = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in metrics.items()}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
