"""scripts/gpu_check.py on a CPU: its dry run takes every stage's code path and writes a well-formed report, so that
a bug costs CI time rather than a lent GPU's; without a GPU it says so in one line; a stage is stopped when its share
of the budget runs out, and a failing one is recorded, the next one running either way."""

import json
import math
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
from gpu_check import STAGES
from tiny_runs import ROOT

from lab.gpu_check.stage import CheckFailed, Stage, error_line, run_stage, workers_output

KERNEL_CONTENDERS = {"F.rms_norm", "fused_rmsnorm", "rmsnorm, torch.compile", "F.layer_norm"}


def test_the_dry_run_takes_every_stage_and_writes_a_well_formed_report(tmp_path, cache_dir):
    command = [sys.executable, "scripts/gpu_check.py", "--dry-run", f"--out={tmp_path}", f"data.cache_dir={cache_dir}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (path,) = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    meta = report["meta"]
    assert meta["dry_run"] and meta["torch"] == torch.__version__ and {"device", "driver", "triton"} <= set(meta)
    assert [stage["name"] for stage in report["stages"]] == [function.__name__ for function, _ in STAGES]
    for stage in report["stages"]:
        assert stage["status"] == "ok", stage  # a dry run that fails is a bug found before a GPU is lent
        assert stage["seconds"] >= 0 and stage["share_s"] > 0 and stage["numbers"], stage["name"]
        for number in stage["numbers"]:
            assert isinstance(number["value"], int | float) and math.isfinite(number["value"]), number
            assert number["unit"] and number["baseline"] and (number["ratio"] is None or math.isfinite(number["ratio"]))
    numbers = {stage["name"]: {n["name"]: n for n in stage["numbers"]} for stage in report["stages"]}
    tests = numbers["correctness"]
    assert tests["tests passed"]["value"] == 1 and tests["tests skipped"]["value"] == 1
    kernels = [n for n in numbers["kernels"].values() if n["pass"] == "fwd+bwd"]
    assert KERNEL_CONTENDERS <= {n["impl"] for n in kernels} and all(0 < n["of_copy"] for n in kernels)
    # Each kernel is timed twice, as the device runs it and as an eager call, for every kind (QK-norm's rows too),
    # and the dry run says why its timings mean nothing.
    assert {n["timing"] for n in kernels} == {"kernel", "call"}
    assert {n["kind"] for n in kernels} == {"rmsnorm", "residual", "partial", "qk"}
    (kernel_stage,) = [stage for stage in report["stages"] if stage["name"] == "kernels"]
    assert "say nothing of a GPU's speed" in kernel_stage["notes"]["timing"]
    # The profile groups the step's time and names its top operators; the groups and the gap add up to the step.
    profile = report["stages"][[s["name"] for s in report["stages"]].index("profile")]["numbers"]
    groups = [n for n in profile if "group" in n and "kernel" not in n]
    assert {"matmuls", "optimizer", "outside aten operators"} <= {n["group"] for n in groups}
    assert sum(n["ratio"] for n in groups) == pytest.approx(1, abs=0.02)  # no time counted twice
    assert any("kernel" in n and n["kernel"].startswith("aten::") for n in profile)
    training = numbers["training"]
    assert {"tokens/s, hf_llama, eager", "model FLOP/s, fused_rmsnorm", "peak memory, prmsnorm"} <= training.keys()
    assert numbers["compiled_vs_eager"]["largest relative loss difference over 3 steps"]["ratio"] <= 1
    assert numbers["distributed"]["norms with float32 parameters, FSDP"]["ratio"] == 1
    table = path.with_suffix(".md").read_text()
    assert all(f"## {stage['name']}" in table for stage in report["stages"]) and table in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what it says where there is no GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_points_at_the_dry_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1 and not result.stdout and not any(tmp_path.iterdir())
    (line,) = result.stderr.strip().splitlines()
    assert "needs a CUDA GPU" in line and "--dry-run" in line


def test_a_failed_launch_keeps_the_worker_s_error_line_and_its_last_lines(tmp_path, cache_dir):
    """A training process that exits with an error: the stage records the worker's own error line (not torchrun's
    "a child failed") and the process's last lines, in the JSON and in the table."""
    command = [sys.executable, "scripts/gpu_check.py", "--dry-run", f"--out={tmp_path}", "--stages", "distributed",
               f"data.cache_dir={cache_dir}", "train.lr=-1"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-4000:]
    (path,) = tmp_path.glob("*.json")
    (stage,) = json.loads(path.read_text())["stages"]
    assert stage["name"] == "distributed" and stage["status"] == "failed"
    assert "exited 1" in stage["error"] and "train.lr=-1.0 is not allowed" in stage["error"], stage["error"]
    assert 0 < len(stage["log_tail"]) <= 40  # torchrun's own report of the failed worker ends it
    assert stage["log_tail"][-1] in path.with_suffix(".md").read_text()


def test_a_failed_stage_does_not_stop_the_next(tmp_path, monkeypatch):
    """The check goes on past a failed stage, and exits 1 once all have run."""
    import gpu_check

    ran = []

    def failing(stage):
        ran.append(stage.name)
        raise CheckFailed("on purpose")

    def passing(stage):
        ran.append(stage.name)
        stage.number("one", 1.0, "s", "none", None)

    failing.__name__, passing.__name__ = "correctness", "kernels"
    monkeypatch.setattr(gpu_check, "STAGES", [(failing, 0.5), (passing, 0.5)])
    # What the dry run sets in its process, put back after the test: torch.compile, the environment, SIGTERM
    monkeypatch.setattr(torch, "compile", torch.compile)
    for name in ("CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # recorded, so that the undo restores or removes it
        monkeypatch.delenv(name)
    monkeypatch.setattr(gpu_check, "signal", types.SimpleNamespace(signal=lambda *_: None, SIGTERM=signal.SIGTERM))
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path)]) == 1
    (path,) = tmp_path.glob("*.json")
    assert ran == ["correctness", "kernels"]
    assert [s["status"] for s in json.loads(path.read_text())["stages"]] == ["failed", "ok"]


TORCHRUN_FAILURE = (
    """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 80, in build_and_train
[rank0]: RuntimeError: set_rng_state expected a CPU tensor
E1206 22:02:54.524000 8411 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)
Traceback (most recent call last):
  File "torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""
    + "=" * 60
    + "\n  rank      : 0 (local_rank: 0)\n"
)


def test_a_worker_s_unlogged_error_is_named_and_kept_not_torchrun_s_report():
    """A worker's exception that train.py does not log (a RuntimeError): its line is the stage's error, and the
    kept lines end with the worker's, not with torchrun's traceback and summary of the failure."""
    assert error_line(TORCHRUN_FAILURE) == "RuntimeError: set_rng_state expected a CPU tensor"
    assert workers_output(TORCHRUN_FAILURE)[-1].endswith("set_rng_state expected a CPU tensor")
    assert error_line("step 1\nterminate called without an active exception\n") == (
        "terminate called without an active exception"
    )


def _stage(tmp_path, share_s: float) -> Stage:
    return Stage("a stage", torch.device("cpu"), True, [], tmp_path, time.monotonic() + share_s, share_s)


def test_a_stage_out_of_its_share_is_skipped_with_what_it_had_measured(tmp_path):
    def slow(stage):
        stage.number("first", 1.0, "s", "none", None)
        stage.progress = "1 of 3 measured"
        time.sleep(30)

    started = time.monotonic()
    record = run_stage(slow, _stage(tmp_path, 0.3))
    assert time.monotonic() - started < 5
    assert record["status"] == "skipped" and "ran out (1 of 3 measured)" in record["reason"]
    assert [n["name"] for n in record["numbers"]] == ["first"]
    assert run_stage(slow, _stage(tmp_path, -1))["status"] == "skipped"  # an earlier stage overran: never started


@pytest.mark.parametrize(
    "error, line",
    [
        (CheckFailed("losses differ by 0.1"), "losses differ by 0.1"),
        (RuntimeError("CUDA error: an illegal memory access\nmore detail"), "RuntimeError: CUDA error: an illegal"),
    ],
)
def test_a_failing_stage_records_its_error_in_one_line(tmp_path, error, line):
    def failing(stage):
        raise error

    record = run_stage(failing, _stage(tmp_path, 10))
    assert record["status"] == "failed" and record["error"].startswith(line) and "\n" not in record["error"]
