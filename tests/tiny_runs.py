"""Composing real configs and running tiny training jobs in-process, for the tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hydra import compose, initialize_config_dir

import train as train_script
from training.config import typed_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "configs")


def compose_composed(*overrides: str):
    """Hydra's composed config (a DictConfig), as train.py's main receives it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def compose_config(*overrides: str):
    """The typed run config ``overrides`` compose, as train.py's main passes it on."""
    return typed_config(compose_composed(*overrides))


def tiny_overrides(cache_dir: str, steps: int = 4, *extra: str) -> list[str]:
    """A tiny model for ``steps`` steps, every telemetry interval short, wandb off."""
    return [
        "model=tiny",
        f"train.max_steps={steps}",
        "train.batch_size=4",
        "train.seq_len=16",  # 64 rows per norm call: the fused kernel runs in the (slow) interpreter
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.eval_every=2",
        "train.stats_every=2",
        "train.checkpoint_every=2",
        "train.perf_warmup_steps=1",
        "train.peak_flops=1e11",
        "data.val_windows=4",
        f"data.cache_dir={cache_dir}",
        "logger=none",
        *extra,
    ]


def train_here(run_dir: Path, *overrides: str) -> dict:
    """The run ``overrides`` describe, trained in this process (no process start)."""
    return train_script.train(compose_config(*overrides), run_dir)


def run_tiny(run_dir: Path, cache_dir: str, steps: int = 4, *extra: str) -> dict:
    return train_here(run_dir, *tiny_overrides(cache_dir, steps, *extra))


def run_all(*commands: list[str], here: tuple[Path, list[str]] | None = None) -> list[str]:
    """Run the commands at once, and ``here``'s run (its directory, its overrides) in this process meanwhile;
    the commands' outputs, once all succeeded."""
    started = [
        subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in commands
    ]
    if here is not None:
        run_dir, overrides = here
        train_here(run_dir, *overrides)
    outputs = [process.communicate(timeout=300)[0] for process in started]
    for process, output in zip(started, outputs):
        assert process.returncode == 0, output[-4000:]
    return outputs


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: torchrun starts its workers in sessions of their own, so a
    killpg of torchrun's group does not reach them."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found
