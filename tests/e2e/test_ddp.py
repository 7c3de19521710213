"""Two-process DDP on CPU (gloo) through torchrun: against one process (trained in this process meanwhile), and
across a SIGKILL."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from tiny_runs import ROOT, descendants, read_metrics, run_all, tiny_overrides

STEPS = 40


@pytest.fixture(scope="module")
def overrides(tmp_path_factory):
    # 1024 tokens per step: 2 processes x batch 8 x seq 64, or 1 process accumulating 2 x 8 x 64.
    cache = str(tmp_path_factory.mktemp("cache"))
    return tiny_overrides(
        cache,
        STEPS,
        "train.batch_size=8",
        "train.seq_len=64",
        "train.global_batch_tokens=1024",
        "train.checkpoint_every=5",
        "train.eval_every=20",
        "train.stats_every=20",
        "train.dist_timeout_s=120",
        # Logit controls that must agree across processes: QK-clip takes the step's largest logit
        # over every rank (an all-reduce), as one process takes it over its micro-batches.
        "train.qk_clip=2",
        "train.z_loss=1e-3",
        # Muon for the blocks' matrices (AdamW for the rest): the optimizer with per-matrix state that
        # must see the same all-reduced gradients as one process's accumulated ones.
        "train.optimizer=muon",
    )


def _torchrun(overrides, run_dir):
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, overrides):
    """One uninterrupted two-process run, and the same run in one process: (their directories, DDP's output)."""
    run_dir, one = tmp_path_factory.mktemp("ddp"), tmp_path_factory.mktemp("one")
    (output,) = run_all(_torchrun(overrides, run_dir), here=(one, overrides))
    return run_dir, one, output


def test_two_processes_match_one_with_the_same_global_batch(ddp_run):
    ddp, one, output = ddp_run
    assert "all 2 processes hold identical weights" in output
    assert "x2, 1024 tokens/step (accum 1)" in output
    # torchrun gives each rank OMP_NUM_THREADS=1 unless the environment sets it, and the run takes that
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    assert yaml.safe_load((ddp / "config.yaml").read_text())["runtime"]["cpu_threads"] == threads

    expected = [r["train/loss"] for r in read_metrics(one)]
    got = [r["train/loss"] for r in read_metrics(ddp)]
    assert len(got) == STEPS  # only rank 0 wrote metrics
    # Same samples, same math; only the order of the gradient reduction differs. Muon's Newton-Schulz
    # runs in bfloat16, where that last-bit difference can flip an update entry's rounding: the losses
    # then agree to about 2e-5 (a rank that skipped the all-reduce would be off by 1e-2 and more).
    assert got == pytest.approx(expected, rel=1e-4)


def test_killed_ddp_run_resumes_exactly(tmp_path, overrides, ddp_run):
    process = subprocess.Popen(
        _torchrun(overrides, tmp_path), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 12:
            break
        time.sleep(0.01)
    assert process.poll() is None, "the run finished before it could be killed"
    for pid in [process.pid, *descendants(process.pid)]:  # torchrun and both workers, at once
        os.kill(pid, signal.SIGKILL)
    process.wait()
    killed_at = len(metrics.read_text().splitlines())
    time.sleep(1)
    assert len(metrics.read_text().splitlines()) == killed_at < STEPS  # nothing kept training

    (output,) = run_all(_torchrun(overrides, tmp_path))
    assert "resuming from step" in output
    expected = {r["step"]: r["train/loss"] for r in read_metrics(ddp_run[0])}
    got = {r["step"]: r["train/loss"] for r in read_metrics(tmp_path)}
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == expected  # same world size, same gloo reduction order: bit for bit
