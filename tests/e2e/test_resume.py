"""Checkpoints and exact resume, with real SIGKILLs of real training processes."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from tiny_runs import ROOT, read_metrics, run_tiny, tiny_overrides

from training.checkpoints.files import list_checkpoints, save_checkpoint
from training.checkpoints.load import load_checkpoint
from training.errors import CheckpointError
from training.run.record import RunIdentityError

STEPS = 40


# Larger batches than the other tiny runs so that a step takes long enough to be killed mid-run.
KILLABLE = (
    "train.batch_size=32",
    "train.seq_len=64",
    "train.checkpoint_every=5",
    "train.eval_every=10",
    "train.stats_every=10",
)


def _command(cache_dir, run_dir, *extra):
    overrides = tiny_overrides(cache_dir, STEPS, *KILLABLE, *extra)
    return [sys.executable, "train.py", *overrides, f"hydra.run.dir={run_dir}"]


def _run(command):
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _logged_steps(run_dir):
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_killed_run_resumes_bit_for_bit(tmp_path, cache_dir):
    """Muon's momentum and AdamW's moments (Muon's optimizer for every parameter that is not a block matrix)
    come back from the checkpoint, and MuonClip's clipping too. AdamW alone is resumed bit for bit in
    test_ddp.py, test_fsdp_training.py and test_ngpt_training.py."""
    extra = ("train.optimizer=muon", "train.qk_clip=0.05")
    uninterrupted, interrupted = tmp_path / "a", tmp_path / "b"
    run_tiny(uninterrupted, cache_dir, STEPS, *KILLABLE, *extra)  # in this process, the same run

    process = subprocess.Popen(
        _command(cache_dir, interrupted, *extra), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while _logged_steps(interrupted) < 17 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = _logged_steps(interrupted)
    assert 0 < killed_at < STEPS

    resumed = _run(_command(cache_dir, interrupted, *extra))
    assert "resuming from step" in resumed.stderr + resumed.stdout
    expected = {r["step"]: r["train/loss"] for r in read_metrics(uninterrupted)}
    got = {r["step"]: r["train/loss"] for r in read_metrics(interrupted)}
    assert sorted(got) == list(range(1, STEPS + 1))  # rows past the checkpoint were replaced, none doubled
    assert got == expected  # bit for bit: float equality of every logged loss
    assert (
        sum(  # MuonClip: QK-clip fired on Muon's matrices
            r.get("train/qk_clipped_heads", 0) for r in read_metrics(interrupted)
        )
        > 0
    )


def test_sigkill_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir, {"step": 1, "model": {"w": torch.ones(3)}}, keep=2)
    # A second process writes a large checkpoint and is killed while the temp file is growing.
    code = (
        "import torch, sys\n"
        "from training.checkpoints.files import save_checkpoint\n"
        f"save_checkpoint({str(run_dir)!r}, {{'step': 2, 'model': {{'w': torch.ones(400_000_000)}}}}, keep=2)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    deadline = time.monotonic() + 120
    partial = []
    while not partial and time.monotonic() < deadline and process.poll() is None:
        partial = [p for p in (run_dir / "checkpoints").glob(".step_0000002.pt.*") if p.stat().st_size > 0]
        time.sleep(0.005)
    assert partial, "the save finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_0000001.pt"]
    assert torch.equal(load_checkpoint(run_dir)["model"]["w"], torch.ones(3))


def test_resume_after_a_killed_save_cleans_up_and_continues(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 4)
    (tmp_path / "checkpoints" / "step_0000004.pt").unlink()  # as if killed while saving step 4
    partial = tmp_path / "checkpoints" / ".step_0000004.pt.abc123.tmp"
    partial.write_bytes(b"half a file")
    run_tiny(tmp_path, cache_dir, 4)
    assert not partial.exists()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_checkpoint_of_another_model_is_refused(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2)
    # The run's record refuses first; a checkpoint that still does not fit is refused by the model check.
    with pytest.raises(RunIdentityError, match=r"model.d_model: 64 in .* vs 32 now"):
        run_tiny(tmp_path, cache_dir, 2, "model.d_model=32")
    with pytest.raises(CheckpointError, match=r"another model config \(d_model: checkpoint 64 vs config 32\)"):
        run_tiny(tmp_path, cache_dir, 2, "model.d_model=32", "resume_with_changes=[model.d_model]")
    with pytest.raises(CheckpointError, match="norm.name: checkpoint 'rmsnorm' vs config 'layernorm'"):
        run_tiny(tmp_path, cache_dir, 2, "norm=layernorm", "resume_with_changes=[norm.name,norm.bias,norm.eps]")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]  # nothing written was lost


def test_only_the_newest_checkpoints_are_kept(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 6, "train.keep_checkpoints=2")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000004.pt", "step_0000006.pt"]
    state = load_checkpoint(tmp_path)
    assert state["step"] == 6 and {"model", "optimizer", "rng", "model_config", "config", "tokenizer"} <= set(state)


def test_unreadable_checkpoint_names_the_file(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step_0000001.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="could not read checkpoint .*step_0000001.pt"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "nowhere")


def test_resume_drops_metrics_after_the_checkpoint_and_a_torn_last_line(tmp_path):
    from training.telemetry.metrics_file import MetricsFile

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "train/loss": 1.5}\n{"step": 3, "train/lo')
    MetricsFile(path, resume_step=1).close()
    assert path.read_text() == '{"step": 1, "train/loss": 2.0}\n'


@pytest.mark.gpu
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_run_on_a_gpu_resumes_to_the_uninterrupted_losses(tmp_path, cache_dir, parallel):
    """On CUDA the checkpoint's RNG states come back as CPU tensors, which torch.set_rng_state needs (read onto the
    model's device they were CUDA tensors, and every GPU resume stopped there)."""
    gpu = ("device=cuda", "train.compile=false", f"train.parallel={parallel}")
    uninterrupted, killed = tmp_path / "a", tmp_path / "b"
    run_tiny(uninterrupted, cache_dir, 4, *gpu)
    run_tiny(killed, cache_dir, 4, *gpu)
    for path in list_checkpoints(killed)[1:]:  # killed after its step-2 checkpoint, as it were
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_tiny(killed, cache_dir, 4, *gpu)
    losses = [
        {r["step"]: r["train/loss"] for r in read_metrics(run) if "train/loss" in r} for run in (uninterrupted, killed)
    ]
    assert losses[0] == losses[1]
