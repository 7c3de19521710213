"""How every report writes a number and a 95% interval, so one table never mixes styles; and its files."""

from __future__ import annotations

import json
from pathlib import Path


def number(value: float | None, spec: str = ".3g") -> str:
    """``value`` in ``spec``, or an en dash where there is none."""
    return "–" if value is None else format(value, spec)


def interval(ci: tuple[float, float] | list[float] | None, spec: str = ".3f") -> str:
    """`` [low, high]`` of a 95% interval, or nothing where there is none (one seed)."""
    return f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else ""


def write_report_files(out: Path, report: str, skipped: list[str], data_name: str, data: dict) -> Path:
    """``out/report.md``, ending with the run folders it skipped and why, and beside it ``out/<data_name>``,
    every number it states; the report's path."""
    if skipped:
        report += "\n## Skipped\n\n" + "\n".join(f"- {message}" for message in skipped) + "\n"
    (out / "report.md").write_text(report)
    (out / data_name).write_text(json.dumps(data, indent=1))
    return out / "report.md"
