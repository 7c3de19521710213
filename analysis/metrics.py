"""The one reader of ``metrics.jsonl``: a run's logged rows, one JSON object per line.

Training appends a row per logged step and flushes it, so a reader can meet a last line that is
still being written (or was cut off by a kill). Analyses refuse any other unreadable line
(the file is damaged); training's own checks (resume, divergence) skip every unreadable line,
since they must work on whatever a killed run left.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class MetricsFileError(ValueError):
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
