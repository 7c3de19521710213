"""Run labels as a study's arms: without the switches every label of the study shares."""

from __future__ import annotations


def shared_switches(labels: list[str]) -> list[str]:
    """The switches every variant's label has (``wd_independent`` when the whole study decays
    independently), so that variants can be named by what tells them apart."""
    parts = [label.split("-") for label in set(labels)]
    if len(parts) < 2:
        return []
    return [part for part in parts[0][1:] if all(part in p[1:] for p in parts)]


def as_arms(labels: list[str]) -> list[str]:
    """Each label as its study's arm, less the switches every label has: ``rmsnorm-qk-wd_independent`` is
    ``rmsnorm-qk`` in a study that decays independently throughout."""
    shared = shared_switches(labels)
    return [without_switches(label, shared) for label in labels]


def without_switches(label: str, switches: list[str]) -> str:
    """``label`` less ``switches`` (its first part, the norm's name, always stays): ``rmsnorm-qk``."""
    parts = label.split("-")
    return "-".join([parts[0], *(p for p in parts[1:] if p not in switches)])
