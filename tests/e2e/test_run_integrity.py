"""A run directory holds one run: resume identity, run names, one writer, safe and robust checkpoint reads."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import export_hf
import numpy as np
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from tiny_runs import CONFIG_DIR, ROOT, read_metrics, run_tiny, tiny_overrides

import eval as eval_script
from model.from_state import FLAT_NORM_FIELDS
from training.checkpoints.files import list_checkpoints
from training.checkpoints.load import load_checkpoint
from training.errors import CheckpointError, UnsafeCheckpointError
from training.run.lock import RunLock
from training.run.record import RunIdentityError, overrides_tag
from training.step.optim import lr_at


def _fingerprint(run_dir):
    """Every file's hash, Hydra's record of the command (.hydra/) and the log included: a refusal changes none."""
    return {
        str(path.relative_to(run_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file()
    }


def _cli(cache_dir, run_dir, steps, *extra, **popen):
    command = [sys.executable, "train.py", *tiny_overrides(cache_dir, steps, *extra), f"hydra.run.dir={run_dir}"]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, **popen)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_different_learning_rate_is_refused_and_the_run_is_untouched(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 4)
    before = _fingerprint(tmp_path)
    result = _cli(cache_dir, tmp_path, 4, "train.lr=0.1")
    assert result.returncode != 0
    message = result.stderr + result.stdout
    assert f"train.lr: 0.003 in {tmp_path / 'config.yaml'} vs 0.1 now" in message
    assert "run_name=" in message and "resume_with_changes=[train.lr]" in message
    assert _fingerprint(tmp_path) == before


def test_a_longer_schedule_is_refused_with_the_reason(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2)
    before = _fingerprint(tmp_path)
    with pytest.raises(RunIdentityError, match=r"train.max_steps: 2 in .* vs 4 now[\s\S]*cosine schedule"):
        run_tiny(tmp_path, cache_dir, 4)
    assert _fingerprint(tmp_path) == before


def test_an_allowed_change_resumes_and_is_recorded_without_replacing_the_record(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2)
    original = yaml.safe_load((tmp_path / "config.yaml").read_text())
    run_tiny(
        tmp_path, cache_dir, 4, "train.lr=0.01", "train.log_every=2", "resume_with_changes=[train.lr,train.max_steps]"
    )
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    (resume,) = record.pop("resumes")
    assert record == original  # the run's own record is kept as it was
    assert resume["step"] == 2 and resume["checkpoint"].endswith("step_0000002.pt")
    assert resume["changes"]["train.lr"] == {"was": 0.003, "now": 0.01}
    assert resume["changes"]["train.max_steps"] == {"was": 2, "now": 4}
    assert resume["changes"]["train.log_every"] == {"was": 1, "now": 2}  # a free key needs no permission
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 4]
    schedule = SimpleNamespace(lr=0.01, min_lr_ratio=0.1, warmup_steps=2, max_steps=4)
    assert read_metrics(tmp_path)[-1]["train/lr"] == lr_at(3, schedule)  # the new schedule ran

    # The accepted values are now the run's: the same command is accepted with no permission (and,
    # the run being finished, trains and writes nothing).
    assert run_tiny(tmp_path, cache_dir, 4, "train.lr=0.01", "train.log_every=2") == {}
    assert len(yaml.safe_load((tmp_path / "config.yaml").read_text())["resumes"]) == 1


def test_a_misspelled_permission_is_refused(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2)
    with pytest.raises(RunIdentityError, match="train.lrr, which is not a config key"):
        run_tiny(tmp_path, cache_dir, 2, "resume_with_changes=[train.lrr]")


def test_run_names_carry_a_hash_of_what_else_the_command_changes():
    keys = ("norm", "model", "seed")
    assert overrides_tag(["norm=rmsnorm", "seed=1", "model=tiny"], keys) == ""
    assert overrides_tag(["train.log_every=5", "logger=none", "device=cpu"], keys) == ""  # free keys
    lr = overrides_tag(["norm=rmsnorm", "train.lr=0.01"], keys)
    assert lr.startswith("-h") and len(lr) == 8
    assert overrides_tag(["train.lr=0.01", "norm=layernorm"], keys) == lr  # order and readable keys do not matter
    assert overrides_tag(["train.lr=0.03"], keys) != lr
    assert overrides_tag(["+train.lr=0.01"], keys) == lr


def test_the_default_run_name_separates_two_commands(tmp_path):
    names = []
    for lr in ("0.003", "0.01", "0.003"):
        result = subprocess.run(
            [sys.executable, "train.py", "--cfg", "job", "--resolve", f"train.lr={lr}", "model=tiny"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        names.append(yaml.safe_load(result.stdout)["run_name"])
    assert names[0] == names[2] != names[1]
    assert names[1].startswith("tiny-rmsnorm-s0-h")


def test_a_second_writer_is_refused_at_once_and_a_killed_writer_blocks_nothing(tmp_path, cache_dir):
    long_run = ("train.batch_size=32", "train.seq_len=64", "train.eval_every=1000", "train.checkpoint_every=5")
    first = _cli(cache_dir, tmp_path, 2000, *long_run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "checkpoints").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, "the first run ended before a second could start"
        second = _cli(cache_dir, tmp_path, 2000, *long_run)
        assert first.poll() is None  # refused while the first still runs: it did not wait for the lock
        assert second.returncode != 0
        assert f"another process is training in {tmp_path} (pid {first.pid} on" in second.stderr + second.stdout
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    lock = RunLock(tmp_path)  # the kernel dropped the killed process's lock: nothing stale blocks
    lock.acquire()
    lock.release()


def test_ctrl_c_stops_in_one_line_naming_the_step_and_the_checkpoint_to_resume_from(tmp_path, cache_dir):
    long_run = ("train.batch_size=32", "train.seq_len=64", "train.eval_every=1000", "train.checkpoint_every=5")
    run = _cli(cache_dir, tmp_path, 2000, *long_run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list_checkpoints(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    output = "".join(run.communicate(timeout=60))
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert run.returncode == 130 and "Traceback" not in output and len(errors) == 1, output[-2000:]
    saved = list_checkpoints(tmp_path)[-1].name
    assert "interrupted (Ctrl-C) after step " in errors[0] and f"resume from {saved}" in errors[0]


def test_a_filesystem_error_is_one_line_naming_the_file():
    from train import stopped_because

    message = stopped_because(PermissionError(13, "Permission denied", "/runs/x/.lock"), ROOT)
    assert message.startswith("Permission denied: /runs/x/.lock. ") and "rerun the same command" in message


def _damage(path):
    path.write_bytes(path.read_bytes()[:100])


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 6, "train.keep_checkpoints=3")
    expected = {r["step"]: r["train/loss"] for r in read_metrics(tmp_path)}
    _damage(tmp_path / "checkpoints" / "step_0000006.pt")
    _damage(tmp_path / "checkpoints" / "step_0000004.pt")
    run_tiny(tmp_path, cache_dir, 6, "train.keep_checkpoints=3")
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert record["resumes"][-1]["step"] == 2
    assert {r["step"]: r["train/loss"] for r in read_metrics(tmp_path)} == expected


def _unreachable(checkpoints, how):
    shutil.rmtree(checkpoints)
    if how == "a dangling link":
        checkpoints.symlink_to(checkpoints.parent / "moved")
    elif how == "a file":
        checkpoints.write_text("")
    elif how == "an empty folder":
        checkpoints.mkdir()


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache_dir):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_tiny(run_dir, cache_dir, 4)
    return run_dir


@pytest.mark.parametrize("how", ["a dangling link", "a file", "an empty folder", "deleted"])
def test_a_run_whose_checkpoints_are_unreachable_is_refused_not_started_over(tmp_path, cache_dir, finished, how):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    _unreachable(run_dir / "checkpoints", how)
    before = _fingerprint(run_dir)
    with pytest.raises(CheckpointError, match=r"checkpoints .*logged step 4 .*never starts over by itself") as refused:
        run_tiny(run_dir, cache_dir, 4)
    assert "\n" not in str(refused.value) and "run_name=" in str(refused.value)
    assert _fingerprint(run_dir) == before  # metrics.jsonl and config.yaml as they were


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.yaml", "tokenizer.json", ".hydra", ".lock"])
def test_a_run_file_that_is_a_link_is_refused_and_its_target_left_alone(tmp_path, cache_dir, finished, name):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(finished, run_dir)
    moved = run_dir / name
    moved.rename(outside) if moved.exists() else outside.mkdir()  # a run trained in-process writes no .hydra
    moved.symlink_to(outside)
    before = _fingerprint(tmp_path)
    with pytest.raises(RunIdentityError, match=f"{moved} is a link to {outside}; .*never through a link"):
        run_tiny(run_dir, cache_dir, 4)
    assert _fingerprint(tmp_path) == before


@pytest.mark.parametrize("damage", ["a shard deleted", "a shard truncated", "the metadata truncated"])
@pytest.mark.filterwarnings("ignore:torch.distributed is .*uninitialized, assuming the intent is to")
def test_a_damaged_sharded_checkpoint_falls_back_to_the_previous_one_with_one_warning(
    tmp_path, cache_dir, damage, caplog
):
    sharded = ("train.parallel=fsdp",)  # one process writes every shard: the same files as under torchrun
    reference = tmp_path / "reference"
    run_tiny(reference, cache_dir, 4, *sharded)
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    newest = run_dir / "checkpoints" / "step_0000004.dcp"
    (shard,) = newest.glob("*.distcp")
    if damage == "a shard deleted":
        shard.unlink()
    else:
        _damage(shard if damage == "a shard truncated" else newest / ".metadata")
    caplog.clear()
    run_tiny(run_dir, cache_dir, 4, *sharded)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "checkpoint" in r.getMessage()]
    assert len(warnings) == 1 and str(newest) in warnings[0] and "step_0000002.dcp" in warnings[0]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["resumes"][-1]["step"] == 2
    losses = [{r["step"]: r["train/loss"] for r in read_metrics(run)} for run in (reference, run_dir)]
    assert losses[0] == losses[1]
    # eval.py and the export read a run directory the same way: the newest checkpoint that reads.
    _damage(run_dir / "checkpoints" / "step_0000004.dcp" / ".metadata")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = eval_script.typed_eval_config(
            compose("eval", overrides=[f"checkpoint={run_dir}", "max_new_tokens=2", "num_samples=1", "logger=none"])
        )
    (result,) = eval_script.run_eval(cfg, tmp_path / "eval").values()
    assert result["checkpoint"].endswith("step_0000002.dcp")
    assert export_hf.main([str(run_dir), str(tmp_path / "hf")]) == 0


def test_no_readable_checkpoint_stops_naming_every_file(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 4)
    for path in list_checkpoints(tmp_path):
        _damage(path)
    before = _fingerprint(tmp_path)
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints[\s\S]*step_0000004.pt[\s\S]*step_0000002.pt"):
        run_tiny(tmp_path, cache_dir, 4)
    assert _fingerprint(tmp_path) == before  # not started over from step 0


class _CreatesAFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_that_would_run_code_is_refused_everywhere(tmp_path):
    marker = tmp_path / "created_by_unpickling"
    crafted = tmp_path / "run" / "checkpoints" / "step_0000001.pt"
    crafted.parent.mkdir(parents=True)
    torch.save({"step": 1, "model": {}, "payload": _CreatesAFile(str(marker))}, crafted)

    with pytest.raises(UnsafeCheckpointError, match=r"refused to load .*step_0000001.pt.*arbitrary code"):
        load_checkpoint(crafted)
    assert export_hf.main([str(crafted), str(tmp_path / "exported")]) == 1
    assert not (tmp_path / "exported").exists()
    with pytest.raises(UnsafeCheckpointError):
        eval_script.evaluate_checkpoint(None, crafted, torch.device("cpu"))
    assert not marker.exists()


def _as_before_the_design_space(config):
    """A run config as the code before placements, QK-norm, gains and per-role options wrote it."""
    config.pop("resume_with_changes")
    config.pop("variant")
    for key in ("placement", "qk", "qk_axis", "roles", "gain", "alpha_init", "shift_init"):
        config["norm"].pop(key)
    config["runtime"]["norm_backend"] = "pytorch"
    config["runtime"].pop("norm_roles")
    config["runtime"]["resumed_from"] = None


def _in_the_flat_layout(model_config: dict) -> dict:
    """A model config as checkpoints stored it before its norm fields were grouped (model/from_state.py)."""
    norm = dict(model_config["norm"])
    flat = {old: norm.pop(new) for old, new in FLAT_NORM_FIELDS.items()}
    return {**model_config, **flat, "norm_role_options": norm.pop("roles"), "norm_options": {
        k: v for k, v in norm.items() if v is not None
    }}  # fmt: skip


def test_a_checkpoint_in_the_previous_format_resumes_and_evaluates_exactly(tmp_path, cache_dir):
    """Before this round, checkpoints held NumPy's RNG state as an array and knew no design-space keys."""
    reference, old = tmp_path / "reference", tmp_path / "old"
    run_tiny(reference, cache_dir, 4)
    run_tiny(old, cache_dir, 4)
    # Rewrite step 2 as the previous code wrote it, and forget step 4.
    state = load_checkpoint(old / "checkpoints" / "step_0000002.pt")
    numpy_state = state["rng"]["numpy"]
    state["rng"]["numpy"] = (
        numpy_state["name"],
        numpy_state["keys"].numpy().astype(np.uint32),
        numpy_state["pos"],
        numpy_state["has_gauss"],
        numpy_state["cached_gaussian"],
    )
    _as_before_the_design_space(state["config"])
    state["model_config"] = _in_the_flat_layout(state["model_config"])
    for key in ("placement", "qk_norm", "qk_axis", "norm_role_options"):
        state["model_config"].pop(key)
    torch.save(state, old / "checkpoints" / "step_0000002.pt")
    os.remove(old / "checkpoints" / "step_0000004.pt")
    record = yaml.safe_load((old / "config.yaml").read_text())
    _as_before_the_design_space(record)
    (old / "config.yaml").write_text(yaml.safe_dump(record))

    evaluated = eval_script.evaluate_checkpoint(
        eval_script_config(), old / "checkpoints" / "step_0000002.pt", torch.device("cpu")
    )
    reference_step_2 = {r["step"]: r for r in read_metrics(reference)}[2]
    assert evaluated["val/loss"] == pytest.approx(reference_step_2["val/loss"], rel=1e-6)

    run_tiny(old, cache_dir, 4)
    assert yaml.safe_load((old / "config.yaml").read_text())["resumes"][0]["step"] == 2
    losses = [{r["step"]: r["train/loss"] for r in read_metrics(run)} for run in (reference, old)]
    assert losses[0] == losses[1]


def eval_script_config():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return eval_script.typed_eval_config(
            compose("eval", overrides=["checkpoint=unused", "logger=none", "num_samples=1", "max_new_tokens=2"])
        )
