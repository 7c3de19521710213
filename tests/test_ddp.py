"""Two-process DDP on CPU (gloo) through torchrun, against one process with the same global batch."""

import os
import signal
import subprocess
import sys
import time

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


def test_killed_ddp_run_resumes_exactly(tmp_path, cache_dir):
    steps = 40
    overrides = tiny_overrides(
        cache_dir,
        steps,
        "train.batch_size=8",
        "train.seq_len=64",
        "train.global_batch_tokens=1024",
        "train.checkpoint_every=5",
        "train.eval_every=20",
        "train.stats_every=20",
        "train.dist_timeout_s=120",
    )
    uninterrupted, interrupted = tmp_path / "a", tmp_path / "b"
    first = subprocess.run(_torchrun(overrides, uninterrupted), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]

    # torchrun and both workers share a new session, so one killpg reaches all three processes.
    process = subprocess.Popen(
        _torchrun(overrides, interrupted),
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = interrupted / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 12:
            break
        time.sleep(0.01)
    assert process.poll() is None, "the run finished before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()

    resumed = subprocess.run(_torchrun(overrides, interrupted), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "resuming from step" in resumed.stdout + resumed.stderr
    expected = {r["step"]: r["train/loss"] for r in read_metrics(uninterrupted)}
    got = {r["step"]: r["train/loss"] for r in read_metrics(interrupted)}
    assert sorted(got) == list(range(1, steps + 1))
    assert got == expected  # same world size, same gloo reduction order: bit for bit
