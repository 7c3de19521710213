"""How to run a sweep on a CPU: one job at a time, or several at once with a share of the cores each.

    python scripts/bench_parallel_sweep.py                       # 4 runs of the stability grid, 2 jobs
    python scripts/bench_parallel_sweep.py --grid +variant=rmsnorm train.lr=1e-2,3e-2,1e-1 --jobs 3

The same small grid of the stability study runs three ways, one after another in this process,
each into a fresh sweep folder: sequentially (each run with every core), in parallel through
Hydra's joblib launcher with each job's share of the cores (cpu_threads: null, the default), and
in parallel with every job asking for every core (the oversubscription that the share prevents).
Reported: wall-clock time of each sweep and its ratio to the sequential one, and the largest
difference in final validation loss from the sequential runs (the thread count changes only the
order of float reductions). Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.runs import find_run_dirs, load_run
from training.run.cpu_threads import available_cores

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GRID = ["+variant=rmsnorm,dyt", "train.lr=1e-2,3e-2"]


def launch_modes(jobs: int, cores: int) -> dict[str, list[str]]:
    """The experiment pins one thread per run under joblib; each mode here says its own launcher and threads."""
    parallel = ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={jobs}"]
    return {
        "sequential": ["hydra/launcher=basic", "cpu_threads=null"],
        f"{jobs} jobs, shared cores": [*parallel, "cpu_threads=null"],
        f"{jobs} jobs x {cores} threads": [*parallel, f"cpu_threads={cores}"],
    }


def final_val_losses(sweep_dir: Path) -> dict[str, float]:
    """Each run's last validation loss, by run folder name."""
    return {path.name: load_run(path).last("val/loss") for path in find_run_dirs([str(sweep_dir)])}


def run_sweep(overrides: list[str], sweep_dir: Path) -> float:
    command = [sys.executable, "train.py", "-m", "+experiment=stability", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"sweep failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", nargs="+", default=DEFAULT_GRID, help="Hydra sweep overrides (the runs to time)")
    parser.add_argument("--jobs", type=int, default=2, help="jobs at once in the parallel modes")
    parser.add_argument("extra", nargs="*", help="Hydra overrides for every run, e.g. train.max_steps=80")
    args = parser.parse_args()
    cores = available_cores()
    work = Path(tempfile.mkdtemp(prefix="normlab-parallel-"))
    try:
        # Tokenizer and token arrays are cached on the first run; time none of that.
        run_sweep([*args.extra, "+variant=rmsnorm", "train.max_steps=1", "train.eval_every=1"], work / "warm-up")
        rows = []
        for mode, overrides in launch_modes(args.jobs, cores).items():
            sweep_dir = work / f"mode{len(rows)}"
            seconds = run_sweep([*args.grid, *args.extra, *overrides], sweep_dir)
            rows.append((mode, seconds, final_val_losses(sweep_dir)))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    sequential_seconds, sequential_losses = rows[0][1], rows[0][2]
    print(f"{len(sequential_losses)} runs ({' '.join(args.grid + args.extra)}) on {cores} cores\n")
    print("| launch | wall-clock | vs sequential | final val loss: largest difference from sequential |")
    print("|---|---:|---:|---|")
    for mode, seconds, losses in rows:
        diff, run = max((abs(losses[run] - sequential_losses[run]), run) for run in sequential_losses)
        where = f" ({run}: {sequential_losses[run]:.4f} -> {losses[run]:.4f})" if diff else ""
        print(f"| {mode} | {seconds:.0f} s | {seconds / sequential_seconds:.2f}x | {diff:.1e}{where} |")


if __name__ == "__main__":
    main()
