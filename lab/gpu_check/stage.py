"""What every stage of the GPU check shares: its share of the budget, its numbers, and the processes it starts.

A stage is a function of a ``Stage``: it reads the device, the run's overrides, a scratch folder and its deadline,
and records numbers (each with its unit and the baseline measured beside it) and notes. ``run_stage`` runs it until
it ends or its share runs out. A process that fails leaves its last lines in the stage's record, so that no
failure on a lent GPU goes unread.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from lab.step_timing import compose_config
from training.telemetry.metrics_file import read_metrics

ROOT = Path(__file__).resolve().parents[2]
TAIL_LINES = 40  # of a failed process's output, kept in the JSON


class OutOfTime(BaseException):
    """A stage's share of the budget ran out (raised by the timer in the main thread; a BaseException, so that
    no ``except Exception`` on the way swallows it)."""


class CheckFailed(Exception):
    """A stage found something wrong; the message is its one-line error, ``tail`` the last lines of the process
    that failed, where one did."""

    def __init__(self, message: str, tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.tail = tail


@dataclass
class Stage:
    """What a stage reads (the device, the run's options, a scratch folder, its deadline) and what it found."""

    name: str
    device: torch.device
    dry_run: bool
    overrides: list[str]  # Hydra overrides of every training run: the recipe, then the command line's
    scratch: Path
    deadline: float  # time.monotonic() at which its share runs out
    share_s: float
    numbers: list[dict] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    progress: str = "nothing measured yet"  # named in the reason when its share runs out

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def number(self, name: str, value: float, unit: str, baseline: str, ratio: float | None, where=None) -> None:
        """A measured number, with its unit and what it is compared with (``ratio`` = value / that baseline);
        ``where`` adds keys for readers (a kernel's implementation, shape and pass; a profile's group)."""
        if not math.isfinite(value):
            raise CheckFailed(f"{name} is {value}")
        number = {"name": name, "value": value, "unit": unit, "baseline": baseline, "ratio": ratio}
        self.numbers.append({**number, **(where or {})})


def _out_of_time(signum, frame):
    raise OutOfTime


def run_stage(function: Callable[[Stage], None], stage: Stage) -> dict:
    """Run one stage until it ends or its share runs out; its record: status, reason or error (and the failed
    process's last lines), time, findings."""
    started = time.monotonic()
    record: dict = {"name": stage.name, "status": "ok"}
    previous = signal.signal(signal.SIGALRM, _out_of_time)
    try:
        if stage.left() <= 0:
            raise OutOfTime
        signal.setitimer(signal.ITIMER_REAL, stage.left())
        function(stage)
    except OutOfTime:
        record.update(status="skipped", reason=f"its share of the budget ran out ({stage.progress})")
    except CheckFailed as err:
        record.update(status="failed", error=str(err), **({"log_tail": err.tail} if err.tail else {}))
    except Exception as err:  # the stage's error, in one line; the next stage runs all the same
        record.update(status="failed", error=one_line(err))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        torch._dynamo.reset()  # each stage compiles its own models; stale entries would count against its limits
        gc.collect()
        if stage.device.type == "cuda":
            torch.cuda.empty_cache()
    seconds = round(time.monotonic() - started, 1)
    return {**record, "seconds": seconds, "share_s": round(stage.share_s, 1), "numbers": stage.numbers,
            "notes": stage.notes}  # fmt: skip


def one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:500]


def workers_output(output: str) -> list[str]:
    """A process's output lines, without torchrun's own report of a failed worker (its traceback and summary box,
    about 35 lines, which say only that a child failed): what the workers printed, or all of it elsewhere."""
    lines = output.rstrip().splitlines()
    launcher = next((i for i, line in enumerate(lines) if "torch.distributed.elastic" in line or
                     "torch/distributed/elastic" in line), len(lines))  # fmt: skip
    return lines[:launcher] or lines


def error_line(output: str) -> str:
    """The line of a process's output that says what went wrong: normlab's last logged error, else C++'s abort
    message, else the last exception line, else the last line; a torchrun worker's, not torchrun's."""
    lines = [line.strip() for line in workers_output(output) if line.strip()]
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line) for line in lines]  # torchrun's prefix of a worker's lines
    logged = [line for line in lines if "[ERROR]" in line]
    aborted = [line for line in lines if line.startswith("terminate called")]
    raised = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    return (logged or aborted or raised or lines or ["(no output)"])[-1][:500]


def run_at_once(stage: Stage, commands: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """Run the commands at once from the repository root, each logging to ``<stage>-<name>.log`` in the scratch
    folder; (exit code, output) of each. When the stage's share runs out, or this script is stopped, each is
    stopped with all it started: SIGTERM to its process group (torchrun passes it on to its workers), then
    SIGKILL."""
    logs = {name: stage.scratch / f"{stage.name}-{name}.log" for name in commands}
    processes: list[subprocess.Popen] = []
    try:
        for name, command in commands.items():
            with open(logs[name], "w") as log:
                processes.append(
                    subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                )
        codes = [process.wait() for process in processes]
    except BaseException:
        stop(processes)
        raise
    return {name: (code, logs[name].read_text()) for name, code in zip(commands, codes)}


def stop(processes: list[subprocess.Popen], grace_s: float = 40) -> None:
    """SIGTERM to each process's group, SIGKILL to what is left after ``grace_s``: longer than the 30 s torchrun
    gives its workers, which run in sessions of their own that only torchrun can stop."""

    def signal_groups(signum):
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)

    signal_groups(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    signal_groups(signal.SIGKILL)
    for process in processes:
        process.wait()


def launched(stage: Stage, commands: dict[str, list[str]]) -> dict[str, str]:
    """run_at_once's outputs, once every command exited 0; else the first failure's error line, its last lines
    kept in the stage's record."""
    results = run_at_once(stage, commands)
    for name, (code, output) in results.items():
        if code != 0:
            tail = workers_output(output)[-TAIL_LINES:]
            raise CheckFailed(f"the {name} launch exited {code}: {error_line(output)}", tail)
    return {name: output for name, (_, output) in results.items()}


# The dry run's children compile with aot_eager, as this process does (the same tracing and autograd, no code
# generation): train.py run as __main__ after that one change.
_DRY_TRAIN = (
    "import functools, runpy, sys, torch; torch.compile = functools.partial(torch.compile, backend='aot_eager'); "
    "sys.argv = ['train.py', *sys.argv[1:]]; runpy.run_path('train.py', run_name='__main__')"
)


def train_command(stage: Stage, overrides: list[str], run_dir: Path, processes: int | None = None) -> list[str]:
    """The command that trains ``overrides`` (after the stage's own) in ``run_dir``: ``python train.py``, or under
    ``torchrun --nproc_per_node=processes``."""
    entry = ["-c", _DRY_TRAIN] if stage.dry_run else ["train.py"]
    if processes is not None:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        entry = [*launcher, *(["--no-python", sys.executable, "-c", _DRY_TRAIN] if stage.dry_run else ["train.py"])]
    return [sys.executable, *entry, *stage.overrides, *overrides, f"hydra.run.dir={run_dir}"]


def interleaved(jobs: dict[str, Callable[[], dict]], rounds: int, stage: Stage) -> dict[str, list[dict]]:
    """Each job once a round, in an order that rotates from round to round so that machine noise falls on all
    alike; each job's results, per round. Fewer rounds (at least one) when the stage's share would not hold one more."""
    results: dict[str, list[dict]] = {name: [] for name in jobs}
    order = list(jobs)
    for round_index in range(rounds):
        started = time.monotonic()
        shift = round_index % len(order)
        for name in order[shift:] + order[:shift]:
            results[name].append(jobs[name]())
        if stage.left() < 1.5 * (time.monotonic() - started):
            break
    return results


def one_batch_per_step(stage: Stage, processes: int = 1) -> str:
    """The override that makes each step one micro-batch per process (train=gpu's 0.5M tokens would be 16)."""
    cfg = compose_config(stage.overrides)
    return (
        f"train.global_batch_tokens={cfg.train.batch_size * (cfg.train.seq_len or cfg.model.max_seq_len) * processes}"
    )


def losses(run_dir: Path) -> dict[int, float]:
    rows = read_metrics(run_dir / "metrics.jsonl").rows
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


def last(run_dir: Path, key: str) -> float:
    return [row[key] for row in read_metrics(run_dir / "metrics.jsonl").rows if key in row][-1]


def runtime(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["runtime"]
