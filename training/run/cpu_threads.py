"""Each training process's share of the CPU cores.

Processes that together ask for more threads than there are cores do not each slow down in
proportion, their OpenMP threads spinning while they wait for each other: on 2 cores, two
2-thread trainings at once took 2.5-2.9x as long as the same runs one after another, and two
1-thread ones 0.9x (scripts/bench_parallel_sweep.py). So a process takes ``cores // processes`` threads, where the
processes are the jobs a parallel Hydra launcher runs at once times the ranks torchrun starts on
this machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig


def available_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's or taskset's limit)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def concurrent_jobs(launcher: Mapping[str, Any] | None, cores: int) -> int:
    """How many Hydra jobs run at once: a launcher's ``n_jobs`` (joblib counts -1 as all cores,
    -2 as all but one), else one."""
    n_jobs = (launcher or {}).get("n_jobs")
    if n_jobs is None:
        return 1
    n_jobs = int(n_jobs)
    if n_jobs == 0:
        raise ValueError("hydra.launcher.n_jobs=0 runs nothing; use a positive count, or -1 for one job per core")
    return n_jobs if n_jobs > 0 else max(1, cores + 1 + n_jobs)


def thread_share(requested: int | None, cores: int, jobs: int, local_ranks: int) -> tuple[int, str]:
    """(threads, why): ``requested`` when given, else OMP_NUM_THREADS when set, else the share."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"cpu_threads must be at least 1, got {requested}; or null for this process's share")
        return requested, "cpu_threads"
    if os.environ.get("OMP_NUM_THREADS"):
        return int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    processes = jobs * local_ranks
    return max(1, cores // processes), f"{cores} cores / {processes} processes"


def use_thread_share(requested: int | None) -> tuple[int, str]:
    """Set torch's intra-op threads to this process's share (see ``thread_share``); returns it."""
    cores = available_cores()
    launcher = HydraConfig.get().launcher if HydraConfig.initialized() else None
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads, why = thread_share(requested, cores, concurrent_jobs(launcher, cores), local_ranks)
    torch.set_num_threads(threads)
    return threads, why
