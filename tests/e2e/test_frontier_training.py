"""The third part of the design space through train.py: HybridNorm*, QKV-norm, SimpleNorm, gated attention and
learned sinks train and resume bit for bit (the gate and the sinks compiled: tests/e2e/test_compiled_training.py)."""

import pytest
from tiny_runs import read_metrics, run_tiny

from training.checkpoints.files import list_checkpoints

SWITCHES = {
    "hybrid_star-gate-sink": ("norm.placement=hybrid_star", "model.attn_gate=elementwise", "model.attn_sink=learned"),
    "after_linear-gate": ("norm.after_linear=rmsnorm", "model.attn_gate=headwise"),
    "qkv": ("norm.qk=rmsnorm", "norm.v=rmsnorm"),
}


def _losses(run_dir):
    return [row["train/loss"] for row in read_metrics(run_dir) if "train/loss" in row]


@pytest.mark.parametrize("switches", SWITCHES.values(), ids=SWITCHES)
def test_an_interrupted_run_resumes_bit_for_bit(tmp_path, cache_dir, switches):
    run_tiny(tmp_path / "whole", cache_dir, 4, *switches)
    interrupted = tmp_path / "interrupted"
    run_tiny(interrupted, cache_dir, 4, *switches)
    list_checkpoints(interrupted)[-1].unlink()  # as if killed after the step-2 checkpoint
    run_tiny(interrupted, cache_dir, 4, *switches)
    assert _losses(interrupted) == _losses(tmp_path / "whole")
