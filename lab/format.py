"""How every report writes a number and a 95% interval, so one table never mixes styles."""

from __future__ import annotations


def number(value: float | None, spec: str = ".3g") -> str:
    """``value`` in ``spec``, or an en dash where there is none."""
    return "–" if value is None else format(value, spec)


def interval(ci: tuple[float, float] | list[float] | None, spec: str = ".3f") -> str:
    """`` [low, high]`` of a 95% interval, or nothing where there is none (one seed)."""
    return f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else ""
