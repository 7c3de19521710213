"""The studies' probes: what only a study reads, loaded only by the runs that ask for them.

A run chooses its probes by config (``train.probes``); the core's are named there by their short name,
these by their import path, the way any probe of one's own is added. The studies' train presets
(configs/train/study.yaml) ask for all of them, and readers take their keys from ``STUDY_PROBES``.
"""

from __future__ import annotations

from training.telemetry.probes import resolve_probe

STUDY_PROBES = (
    "lab.study_probes.timing:NormTime",  # perf/norm_forward_ms, perf/norm_time_frac
    "lab.study_probes.layer_importance:LayerImportance",  # act/layers.{i}/angular_distance
    "lab.study_probes.massive:MassiveActivations",  # act/layers.{i}/massive_ratio, ...
    "lab.study_probes.attention_sinks:AttentionSinks",  # attn/layers.{i}/sink_mass, ...
    "lab.study_probes.ngpt:NGPTScales",  # nGPT's learned scales and stream norm
)


def study_probe_keys() -> tuple[str, ...]:
    """Every key template the studies' probes write."""
    return tuple(key for path in STUDY_PROBES for key in resolve_probe(path).keys)
