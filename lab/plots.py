"""Matplotlib set-up shared by the scripts: a headless backend, and one way to save a figure."""

from pathlib import Path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def error_bars(values: list[float], intervals: list) -> list[list[float]]:
    """Matplotlib's ``yerr`` (below, above) for values with 95% intervals (None: no bar)."""
    return [
        [y - (ci or (y, y))[0] for y, ci in zip(values, intervals)],
        [(ci or (y, y))[1] - y for y, ci in zip(values, intervals)],
    ]
