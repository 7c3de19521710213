"""The stability study's sweep mechanics: one command, resumable, divergence recorded as a result."""

import dataclasses
import os
import subprocess
import sys

import pytest
import yaml
from tiny_runs import ROOT, compose_config, read_metrics, tiny_overrides

from lab.study import matches
from lab.study_spec import load_study_spec
from training.run.resume import flatten

STUDY_VARIANTS = sorted(p.stem for p in (ROOT / "configs" / "variant").glob("*.yaml"))


def _sweep(sweep_dir, cache_dir, *grid):
    """The study's command on a tiny model and a small grid (grid overrides replace the experiment's)."""
    overrides = [o for o in tiny_overrides(cache_dir, 3) if not o.startswith("train.max_steps")]
    command = [
        sys.executable, "train.py", "-m", "+experiment=stability", *overrides,
        "train.max_steps=3", "data.heldout_windows=2", *grid,
    ]  # fmt: skip
    if not any(o.startswith("hydra/launcher=") for o in grid):
        command.append("hydra/launcher=basic")  # one process: quicker here than the experiment's joblib
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [*command, f"hydra.sweep.dir={sweep_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _contents(sweep_dir):
    return {
        p: p.read_bytes() for p in sweep_dir.rglob("*") if p.is_file() and p.name in ("metrics.jsonl", "config.yaml")
    }


def test_the_default_grid_is_a_common_grid_of_half_decades_that_can_reach_wortsmans_range():
    experiment = yaml.safe_load((ROOT / "configs" / "experiment" / "stability.yaml").read_text())
    params = experiment["hydra"]["sweeper"]["params"]
    variants = params["+variant"].split(",")
    assert set(variants) <= set(STUDY_VARIANTS) and len(variants) >= 6
    spec = load_study_spec("stability")
    assert {"rmsnorm", "layernorm", "prmsnorm", "rmsnorm_qk"} <= set(spec.plan.headline) <= set(variants)
    # Every arm a claim compares runs the headline's seeds.
    configs = {variant: compose_config(f"+variant={variant}") for variant in STUDY_VARIANTS}
    labels = claim_arm_labels(spec, configs)
    arms = {v for v in variants if configs[v].variant in labels}
    assert arms <= set(spec.plan.headline)
    rates = [float(lr) for lr in params["train.lr"].split(",")]
    assert len(rates) >= 5 and rates[0] <= 1e-3 and rates[-1] >= 1e-1
    # A best rate at an edge gets half-decades beyond it: far enough to reach 3e-4 and 3e-1.
    assert spec.plan.extra_rates >= 1
    assert all(2.9 < b / a < 3.4 for a, b in zip(rates, rates[1:]))  # half-decades: 1, 3, 10, ...
    assert "override /train: study" in (ROOT / "configs" / "experiment" / "stability.yaml").read_text()
    train = yaml.safe_load((ROOT / "configs" / "train" / "study.yaml").read_text())
    assert train["weight_decay_mode"] == "independent" and train["warmup_steps"] >= 2 / (1 - 0.95)


def test_sweep_runs_records_divergence_and_a_rerun_trains_nothing(tmp_path, cache_dir):
    _sweep(tmp_path, cache_dir, "+variant=rmsnorm,identity", "train.lr=0.001,10000.0")
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    assert runs == [
        f"tiny-{v}-wd_independent-lr{lr}-s0" for v in ("identity", "rmsnorm") for lr in ("0.001", "10000.0")
    ]
    diverged = [r for r in runs if any(row.get("diverged") for row in read_metrics(tmp_path / r))]
    assert "tiny-identity-wd_independent-lr10000.0-s0" in diverged  # no norm at a huge learning rate: NaN, recorded
    assert not any("lr0.001" in r for r in diverged)
    for run in diverged:
        last = read_metrics(tmp_path / run)[-1]
        assert last["diverged"] is True and isinstance(last["step"], int)

    before = _contents(tmp_path)
    rerun = _sweep(tmp_path, cache_dir, "+variant=rmsnorm,identity", "train.lr=0.001,10000.0")
    assert _contents(tmp_path) == before  # finished and diverged runs are skipped, nothing rewritten
    assert "nothing to train" in rerun.stderr + rerun.stdout


def test_the_gpu_grid_is_the_same_study_on_a_larger_model_and_says_what_it_would_run(tmp_path):
    cfg = compose_config("+experiment=stability_gpu", "+variant=rmsnorm_qk", "train.lr=0.01", "seed=2")
    assert cfg.model.name == "gpu_25m" and cfg.norm.qk == "rmsnorm" and cfg.train.nan_policy == "record"
    assert cfg.run_name == "gpu_25m-rmsnorm-qk-wd_independent-lr0.01-s2"
    assert cfg.train.weight_decay_mode == "independent" and cfg.cpu_threads is None
    dry = subprocess.run(
        [sys.executable, "-m", "lab", "study", "+experiment=stability_gpu", f"hydra.sweep.dir={tmp_path}", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "runs to train now" in dry.stdout and not any(tmp_path.iterdir())  # a dry run writes nothing
    spec = load_study_spec("stability_gpu")
    assert spec.plan.seconds_per_run == 600 and spec.claims == load_study_spec("stability").claims
    headline = ",".join(spec.plan.headline)
    assert f"+variant={headline} train.lr=0.001,0.003,0.01,0.03,0.1 seed=0,1,2,3,4" in dry.stdout


def test_the_grid_fans_out_through_hydras_submitit_launcher(tmp_path, cache_dir):
    """What a cluster runs (hydra/launcher=submitit_slurm), here with the local executor: each job is a
    process of its own that submitit starts, and the runs land in the sweep folder as with the default."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    grid = (
        "+variant=rmsnorm,layernorm",
        "train.lr=0.001",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=5",
    )
    _sweep(tmp_path, cache_dir, *grid, "cpu_threads=1")
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "config.yaml").exists())
    assert runs == ["tiny-layernorm-wd_independent-lr0.001-s0", "tiny-rmsnorm-wd_independent-lr0.001-s0"]
    assert all(read_metrics(tmp_path / r)[-1]["step"] == 3 for r in runs)
    assert (tmp_path / ".submitit").is_dir()  # submitit's own job records, beside the runs
    # That a rerun of a finished grid trains nothing is the launcher-independent resume rule, tested with the
    # default launcher (test_sweep_runs_records_divergence_and_a_rerun_trains_nothing).


def claim_arm_labels(spec, configs: dict) -> set[str]:
    """The labels of the variants (``configs``: each variant's composed config) that some claim's arm (or what it
    is compared with) picks."""
    labels = set()
    for cfg in configs.values():
        flat = flatten(dataclasses.asdict(cfg))
        if any(matches(flat.__getitem__, fields) for claim in spec.claims for fields in (claim.arm, claim.against)):
            labels.add(cfg.variant)
    return labels
