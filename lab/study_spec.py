"""A study's spec, ``configs/study/<name>.yaml``: the plan after its grid, and the claims its report evaluates.

A study is two files of one name: ``configs/experiment/<name>.yaml``, the sweep that trains its
runs (what every run computes), and ``configs/study/<name>.yaml``, what the study code does with
them. The run schema knows nothing of studies, so a run's identity never depends on a claim. A
spec may start from another (``extends: stability``) and replace parts of its plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional  # noqa: UP035  # OmegaConf reads these annotations

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lab.claims import Claim
from lab.study_plan import StudyPlan

# ruff: noqa: UP006, UP045

SPECS = Path(__file__).resolve().parents[1] / "configs" / "study"


class StudySpecError(ValueError):
    """A spec that is missing or does not fit the schema; the message names the file and the key."""


@dataclass
class StudySpec:
    plan: StudyPlan = field(default_factory=StudyPlan)
    claims: List[Claim] = field(default_factory=list)
    extends: Optional[str] = None  # another spec this one starts from
    title: str = "Stability study: norm variants across learning rates"  # the report's heading


def load_study_spec(name: str, overrides: list[str] = (), folder: Path = SPECS) -> StudySpec:
    """The spec ``folder/<name>.yaml`` with ``overrides`` (``plan.report_seeds=3``) on top, typed: a
    misspelled key or a wrong type is refused with its name."""
    path = Path(folder) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in Path(folder).glob("*.yaml"))) or "none"
        raise StudySpecError(f"no study spec {path} (specs: {known}); a study needs configs/study/<experiment>.yaml")
    try:
        raw = OmegaConf.load(path)
        base = OmegaConf.structured(load_study_spec(raw.extends, folder=folder) if raw.get("extends") else StudySpec)
        spec = OmegaConf.to_object(OmegaConf.merge(base, raw, OmegaConf.from_dotlist(list(overrides))))
    except (OmegaConfBaseException, ValueError) as err:
        raise StudySpecError(f"{path}: {err}") from err
    return spec
