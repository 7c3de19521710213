"""Each training process takes its share of the cores: parallel sweeps and torchrun do not oversubscribe."""

import os
import subprocess
import sys

import pytest
import yaml
from tiny_runs import ROOT, tiny_overrides

from training.run.cpu_threads import available_cores, concurrent_jobs, thread_share


@pytest.fixture
def no_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.parametrize(
    ("cores", "jobs", "ranks", "threads"),
    [(2, 1, 1, 2), (2, 2, 1, 1), (16, 4, 1, 4), (16, 3, 1, 5), (16, 2, 4, 2), (2, 4, 1, 1), (8, 1, 8, 1)],
)
def test_the_share_is_cores_over_processes_and_at_least_one(no_omp, cores, jobs, ranks, threads):
    assert thread_share(None, cores, jobs, ranks) == (threads, f"{cores} cores / {jobs * ranks} processes")


def test_an_explicit_count_wins_then_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_share(None, 16, 2, 1) == (3, "OMP_NUM_THREADS")
    assert thread_share(5, 16, 2, 1) == (5, "cpu_threads")


def test_bad_counts_name_the_key():
    with pytest.raises(ValueError, match="cpu_threads must be at least 1"):
        thread_share(0, 2, 1, 1)
    with pytest.raises(ValueError, match="hydra.launcher.n_jobs=0"):
        concurrent_jobs({"n_jobs": 0}, 8)


@pytest.mark.parametrize(
    ("launcher", "jobs"),
    [(None, 1), ({"_target_": "BasicLauncher"}, 1), ({"n_jobs": 3}, 3), ({"n_jobs": -1}, 8), ({"n_jobs": -2}, 7)],
)
def test_concurrent_jobs_follow_joblibs_convention(launcher, jobs):
    assert concurrent_jobs(launcher, 8) == jobs


def test_a_parallel_sweep_gives_each_job_its_share(tmp_path, cache_dir):
    """Two runs at once through Hydra's joblib launcher: each records (and logs) half the cores."""
    overrides = [o for o in tiny_overrides(cache_dir, 2) if not o.startswith("train.max_steps")]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    command = [sys.executable, "train.py", "-m", "+experiment=stability", *overrides, "train.max_steps=2"]
    command += ["+variant=rmsnorm,identity", "train.lr=1e-3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    command += [
        "cpu_threads=null",
        "data.heldout_windows=0",
    ]  # the experiment pins one thread; a tiny corpus holds no held-out windows
    result = subprocess.run(
        [*command, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [yaml.safe_load(p.read_text()) for p in (tmp_path / "sweep").glob("*/config.yaml")]
    assert len(records) == 2
    share = max(1, available_cores() // 2)
    assert [r["runtime"]["cpu_threads"] for r in records] == [share, share]
    assert (result.stdout + result.stderr).count(f"{share} CPU threads") == 2
