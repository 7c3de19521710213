"""train.parallel=fsdp on CPU (gloo) through torchrun: against one process, across a SIGKILL, resumed on another
number of processes, and read by eval.py and the export in one process. Launches that do not depend on each
other run at once, and the one-process references train in this process while they do, to keep the wall time
down.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from export_hf import export
from hydra import compose, initialize_config_dir
from tiny_runs import CONFIG_DIR, ROOT, descendants, read_metrics, run_all, run_tiny

import eval as eval_script
from training.checkpoints.sharded import read_checkpoint

# In-process runs and reads are one process writing or reading every shard, which DCP warns of.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is .*uninitialized, assuming the intent is to")
STEPS = 20
# The definition of done's commands: 1024 tokens per step, 2 processes x batch 8 x seq 64, or 1 accumulating 2.
COMMAND = ["model=tiny", "norm=rmsnorm", "train.batch_size=8", "train.global_batch_tokens=1024", "logger=none"]
PEAK_FLOPS = "train.peak_flops=1e11"  # for MFU, instead of a matmul measured at every process's start


def _overrides(cache_dir, steps=STEPS, *extra):
    return [
        *COMMAND,
        f"train.max_steps={steps}",
        "train.log_every=1",
        "train.checkpoint_every=5",
        "train.keep_checkpoints=3",
        "train.dist_timeout_s=120",
        f"data.cache_dir={cache_dir}",
        PEAK_FLOPS,
        *extra,
    ]


def _command(run_dir, overrides, processes=2):
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes else []
    return [sys.executable, *launcher, "train.py", *overrides, "train.parallel=fsdp", f"hydra.run.dir={run_dir}"]


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_metrics(run_dir) if "train/loss" in r}


def _record(run_dir) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cache_dir):
    """The definition of done's pair: FSDP at 2 ranks, and one plain process; (dirs, FSDP's output)."""
    sharded, whole = tmp_path_factory.mktemp("fsdp2"), tmp_path_factory.mktemp("one")
    (output,) = run_all(_command(sharded, _overrides(cache_dir)), here=(whole, _overrides(cache_dir)))
    return sharded, whole, output


def test_fsdp_at_two_ranks_matches_one_process(runs):
    sharded, whole, output = runs
    assert "x2, 1024 tokens/step (accum 1)" in output and "identical weights" not in output  # each holds a shard
    got, expected = _losses(sharded), _losses(whole)
    assert sorted(got) == list(range(1, STEPS + 1))  # only rank 0 wrote metrics
    # Same samples, same math: only the order of the gradient reductions differs.
    assert [got[s] for s in got] == pytest.approx([expected[s] for s in got], rel=1e-5)
    last_sharded, last_whole = read_metrics(sharded)[-1], read_metrics(whole)[-1]
    for key in ("val/loss", "act/layers.1.mlp_norm/gain_mean", "grad/layers.0"):  # evaluation, probes, gradients
        assert last_sharded[key] == pytest.approx(last_whole[key], rel=1e-4), key
    assert {p.suffix for p in (sharded / "checkpoints").iterdir()} == {".dcp"}  # each rank wrote its shards
    memory, whole_memory = _record(sharded)["runtime"]["memory_per_rank"], _record(whole)["runtime"]["memory_per_rank"]
    for key, value in memory.items():  # rank 0 holds half of every parameter, rounded up
        assert whole_memory[key] / 2 <= value < whole_memory[key] / 2 * 1.05, key


@pytest.mark.parametrize(
    "extra",
    [
        # another norm and placement, and QK-clip rescaling the q and k rows each rank holds
        ("norm=layernorm", "norm.placement=peri", "train.qk_clip=0.05"),
        # nGPT: its weights renormalized on the shards after every step, its scales float32
        ("norm=ngpt",),
    ],
    ids=["layernorm-peri-qk_clip", "ngpt"],
)
def test_other_norms_placements_and_post_step_hooks_match_one_process(tmp_path, cache_dir, extra):
    overrides = _overrides(cache_dir, 6, *extra)
    run_all(_command(tmp_path / "fsdp", overrides), here=(tmp_path / "one", overrides))
    got, expected = _losses(tmp_path / "fsdp"), _losses(tmp_path / "one")
    assert list(got.values()) == pytest.approx(list(expected.values()), rel=1e-5)
    clipped = [r.get("train/qk_clipped_heads") for r in read_metrics(tmp_path / "fsdp")]
    if "train.qk_clip=0.05" in extra:
        assert clipped == [r.get("train/qk_clipped_heads") for r in read_metrics(tmp_path / "one")] and sum(clipped)


def test_killed_fsdp_run_resumes_exactly(tmp_path, cache_dir, runs):
    process = subprocess.Popen(
        _command(tmp_path, _overrides(cache_dir)), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 7:  # past the checkpoint of step 5
            break
        time.sleep(0.005)
    assert process.poll() is None, "the run finished before it could be killed"
    for pid in [process.pid, *descendants(process.pid)]:  # torchrun and both workers, at once
        os.kill(pid, signal.SIGKILL)
    process.wait()
    assert len(metrics.read_text().splitlines()) < STEPS

    (output,) = run_all(_command(tmp_path, _overrides(cache_dir)))
    assert "resuming from step" in output
    got = _losses(tmp_path)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == _losses(runs[0])  # same world size, same reductions: bit for bit


def _resumable_copy(run_dir, to, step=15):
    """A copy of a finished run with its checkpoints after ``step`` removed: a rerun resumes from ``step``."""
    shutil.copytree(run_dir, to)
    for later in [p for p in (to / "checkpoints").iterdir() if int(p.stem.split("_")[1]) > step]:
        shutil.rmtree(later) if later.is_dir() else later.unlink()
    return to


def test_resumes_on_another_number_of_processes_continue_the_same_losses(tmp_path, cache_dir, runs):
    sharded, whole, _ = runs
    to_one = _resumable_copy(sharded, tmp_path / "2-to-1")  # torchrun --nproc_per_node 1
    to_plain = _resumable_copy(sharded, tmp_path / "2-to-plain")  # python train.py, no torchrun
    to_two = _resumable_copy(whole, tmp_path / "1-to-2")  # one process's .pt, sharded across 2
    outputs = run_all(
        _command(to_one, _overrides(cache_dir), 1),
        _command(to_plain, _overrides(cache_dir), 0),
        _command(to_two, _overrides(cache_dir)),
    )
    assert all("resuming from step 15" in output for output in outputs)
    assert outputs[1].count("train.parallel=fsdp without torchrun: one process") == 1
    expected = _losses(sharded)
    for run_dir in (to_one, to_plain, to_two):
        got = _losses(run_dir)
        assert sorted(got) == list(range(1, STEPS + 1))
        assert [got[s] for s in range(16, STEPS + 1)] == pytest.approx(
            [expected[s] for s in range(16, STEPS + 1)], rel=1e-5
        )
    assert (to_two / "checkpoints" / "step_0000020.dcp").is_dir()  # written sharded from the whole checkpoint


def test_a_sharded_checkpoint_resumes_without_fsdp(tmp_path, cache_dir):
    """train.parallel may change on resume (a free key): a run written sharded continues as a plain one."""
    reference = run_tiny(tmp_path / "plain", cache_dir, 4)
    run_tiny(tmp_path / "run", cache_dir, 4, "train.parallel=fsdp")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_0000004.dcp")
    resumed = run_tiny(tmp_path / "run", cache_dir, 4)
    assert _losses(tmp_path / "run") == _losses(tmp_path / "plain") and resumed["train/loss"] == reference["train/loss"]
    assert (tmp_path / "run" / "checkpoints" / "step_0000004.pt").is_file()
    assert _record(tmp_path / "run")["resumes"][0]["changes"]["train.parallel"] == {"was": "fsdp", "now": "ddp"}


def test_eval_and_export_read_a_two_rank_checkpoint_in_one_process(tmp_path, runs):
    """eval.py and the export need no process group: the shards of both ranks are read whole."""
    sharded, whole, _ = runs
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = eval_script.typed_eval_config(
            compose("eval", overrides=[f"checkpoint={sharded}", "max_new_tokens=4", "num_samples=1"])
        )
    (result,) = eval_script.run_eval(cfg, tmp_path / "eval").values()
    assert result["checkpoint"].endswith("step_0000020.dcp")
    assert result["val/loss"] == pytest.approx(read_metrics(sharded)[-1]["val/loss"], rel=1e-6)  # the same windows
    weights, whole_weights = read_checkpoint(sharded)[1]["model"], read_checkpoint(whole)[1]["model"]
    assert weights.keys() == whole_weights.keys()
    assert all(torch.allclose(weights[k], whole_weights[k], rtol=1e-4, atol=1e-6) for k in weights)
    assert (export(sharded, tmp_path / "hf") / "model.safetensors").is_file()
