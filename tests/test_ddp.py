"""Two-process DDP on CPU (gloo) through torchrun, against one process with the same global batch."""

import subprocess
import sys

import pytest
from tiny_runs import ROOT, read_metrics, tiny_overrides

STEPS = 6


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def test_two_processes_match_one_with_the_same_global_batch(tmp_path, cache_dir):
    # 128 tokens per step: 2 processes x batch 4 x seq 16, or 1 process accumulating 2 x 4 x 16.
    overrides = tiny_overrides(cache_dir, STEPS, "train.global_batch_tokens=128", "train.dist_timeout_s=120")
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    subprocess.run(
        [sys.executable, "train.py", *overrides, f"hydra.run.dir={single}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "train.py",
            *overrides,
            f"hydra.run.dir={ddp}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "all 2 processes hold identical weights" in output
    assert "x2, 128 tokens/step (accum 1)" in output

    expected = [r["train/loss"] for r in read_metrics(single)]
    got = [r["train/loss"] for r in read_metrics(ddp)]
    assert len(got) == STEPS  # only rank 0 wrote metrics
    # Same samples, same math; only the order of the gradient reduction differs.
    assert got == pytest.approx(expected, rel=1e-5)
