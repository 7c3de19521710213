"""Metric keys as readers ask for them: by the templates the probes declare, never by substring.

    STREAM_RMS = metric_key("act/layers.{i}/stream_rms")   # fails here if no probe writes it
    STREAM_RMS.format(i=3)                                  # "act/layers.3/stream_rms"
    fields(STREAM_RMS, "act/layers.3/stream_rms")           # {"i": "3"}

Readers define their keys at import time, so renaming a key in a probe without renaming its
readers fails the first test that imports them.
"""

from __future__ import annotations

import functools
import re

from lab.study_probes import study_probe_keys
from training.telemetry.probes import declared_keys


class UnknownMetricKey(KeyError):
    """A reader asked for a key that no probe (nor the training loop) declares."""


@functools.cache
def every_declared_key() -> tuple[str, ...]:
    """The templates the core declares (the loop's and its probes') and the studies' probes."""
    return declared_keys() + study_probe_keys()


def metric_key(template: str) -> str:
    """``template`` itself, once checked against every declared key template."""
    declared = every_declared_key()
    if template not in declared:
        raise UnknownMetricKey(
            f"no probe declares the metric key {template!r}; declared: {', '.join(declared)} "
            "(training/telemetry/probes/ and lab/study_probes/: each probe's `keys`)"
        )
    return template


@functools.cache
def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(regex + r"\Z")


def fields(template: str, key: str) -> dict[str, str] | None:
    """The template's fields in ``key`` (``{"norm": "layers.0.attn_norm"}``), or None if it does not match."""
    found = _pattern(template).match(key)
    return found.groupdict() if found else None


def instances(template: str, keys, field: str) -> list[str]:
    """The distinct values of ``field`` over the keys that match ``template``, in the order met."""
    values: dict[str, None] = {}
    for key in keys:
        matched = fields(template, key)
        if matched is not None:
            values.setdefault(matched[field], None)
    return list(values)
