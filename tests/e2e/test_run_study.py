"""python -m lab study: one command trains a study's grid, its edges and its seeds, then reports."""

import json
import os
import shutil
import subprocess
import sys

from tiny_runs import ROOT, tiny_overrides

from lab.run_study import evaluate_layer_importance, finished_losses
from lab.runs import find_runs
from lab.study import skip_deltas
from lab.study_plan import StudyPlan
from training.run.lock import RunLock


def _run_study(tmp_path, cache_dir, *extra):
    overrides = [o for o in tiny_overrides(cache_dir, 3) if not o.startswith("train.max_steps")]
    command = [
        sys.executable, "-m", "lab", "study", "+experiment=stability", "hydra/launcher=basic", *overrides,
        "train.max_steps=3", "data.heldout_windows=2", "+variant=rmsnorm,identity", "train.lr=0.001,0.01",
        "plan.headline=[]", "plan.selection_seeds=1", "plan.report_seeds=2",
        "plan.extra_rates=1", f"hydra.sweep.dir={tmp_path / 'runs'}", "--out", str(tmp_path / "report"), *extra,
    ]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_one_command_runs_the_grid_the_edges_and_the_seeds_then_reports(tmp_path, cache_dir):
    first = _run_study(tmp_path, cache_dir)
    assert "runs to train now" in first and "min left" in first
    data = json.loads((tmp_path / "report" / "study.json").read_text())
    assert data["learning_rates"] == [0.001, 0.01]
    cells = {(c["variant"], c["lr"], c["seed"]) for c in data["cells"]}
    for arm in ("rmsnorm", "identity"):  # no headline here: the unit tests cover the headline's seeds
        v = data["variants"][arm]
        assert {(arm, lr, 0) for lr in v["rates"]} <= cells and len(v["rates"]) <= 2 + 1  # an edge adds one
        assert (v["selection_seeds"], v["report_seeds"]) == ([0], [1, 2])  # the seed that chose never reports
        assert {(arm, v["best_lr"], s) for s in (1, 2)} <= cells and v["best_loss"]["seeds"] == 2
    assert all(c["heldout_loss"] is not None for c in data["cells"])
    assert "nothing to train" in _run_study(tmp_path, cache_dir, "--dry-run")


def test_the_layer_importance_stage_evaluates_each_report_seeds_checkpoint_once(sweep, tmp_path):
    """plan.layer_importance: eval.py layer_importance=true on the report seeds' runs only (here seed 1 of two),
    and not again once their eval.json has skip deltas."""
    shutil.copytree(sweep, tmp_path / "runs")
    runs = find_runs([str(tmp_path / "runs")])
    labels = {(r.config["model"]["name"], r.config["variant"]): (None, r.config["variant"]) for r in runs}
    plan = StudyPlan(headline=[], selection_seeds=1, report_seeds=1)  # seed 0 selects, seed 1 reports
    evaluate_layer_importance(tmp_path / "runs", labels, plan)
    evaluated = {r.path.name: skip_deltas(r) for r in find_runs([str(tmp_path / "runs")])}
    assert {name for name, deltas in evaluated.items() if deltas} == {"rmsnorm-s1", "layernorm-s1"}
    assert all(len(deltas) == 2 for name, deltas in evaluated.items() if deltas)  # the tiny model's two blocks
    written = (tmp_path / "runs" / "rmsnorm-s1" / "eval.json").stat().st_mtime_ns
    evaluate_layer_importance(tmp_path / "runs", labels, plan)
    assert (tmp_path / "runs" / "rmsnorm-s1" / "eval.json").stat().st_mtime_ns == written


def test_a_run_another_process_is_training_is_named_with_that_process_not_trained_again(sweep, tmp_path):
    """run_study skips a run whose lock another live process holds, and names that process, rather than
    launching a train.py that the lock refuses and then calling the run one that did not finish."""
    shutil.copytree(sweep, tmp_path / "runs")
    training = tmp_path / "runs" / "rmsnorm-s1"
    metrics = (training / "metrics.jsonl").read_text().splitlines()
    (training / "metrics.jsonl").write_text(metrics[0] + "\n")  # part way through: its first logged step only
    labels = {("tiny", norm): (None, norm) for norm in ("rmsnorm", "layernorm")}
    lock = RunLock(training)
    lock.acquire()
    try:
        losses, _, elsewhere = finished_losses(tmp_path / "runs", labels)
    finally:
        lock.release()
    ((key, holder),) = elsewhere.items()
    assert key[:2] == (None, "rmsnorm") and key[3] == 1 and holder.startswith(f"pid {os.getpid()} ")
    assert set(losses[(None, "rmsnorm")]) == {(key[2], 0)} and len(losses[(None, "layernorm")]) == 2
    assert finished_losses(tmp_path / "runs", labels)[2] == {}  # released (or killed): trained again, as before
