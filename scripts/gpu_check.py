"""The GPU path in one command: is normlab correct on this GPU, and how fast is it, within a time budget.

    python scripts/gpu_check.py                            # one H100/H200-class GPU: about 8 minutes
    python scripts/gpu_check.py --budget-s 900 --out bench_out/gpu data.cache_dir=/scratch/normlab
    python scripts/gpu_check.py --dry-run --out /tmp/gpu_check    # every stage's code on this CPU, tiny

Five stages, in order of value. Each gets its share of --budget-s (time a stage leaves unused passes on to the
next); a stage whose share runs out is stopped and recorded as skipped, with the reason and what it had measured,
and a stage that fails records its error in one line; the next stage runs either way.

1. correctness: the tests marked ``gpu`` (pytest -m gpu, a subprocess), counted: the fused kernel against float64
   in float32, bfloat16 and float16, partial, with the residual add, past 2**31 elements; the model with the fused
   norm against the one with PyTorch's.
2. kernel_bandwidth: the fused RMSNorm against eager F.rms_norm, RMSNorm under torch.compile, F.layer_norm and
   Liger's RMSNorm (when installed), in bfloat16 at rows x D of training batches from D = 768 to 16,384, forward,
   backward and both, timed twice (analysis/bench_norms.py, interleaved rounds): the kernel time (do_bench, the L2
   flushed before each call) and the call time an eager loop pays (back-to-back calls, host included). GB/s against
   the reference, and as a fraction of a device copy measured alongside. Then the residual-add and partial forms
   against their unfused equivalents, and QK-norm's many short rows (head_dim 64 and 128).
3. training: model=gpu_125m train=gpu with LayerNorm, RMSNorm, the fused RMSNorm and pRMSNorm (compiled, as the
   recipe runs them), RMSNorm eager and Hugging Face's LlamaForCausalLM of the same shape and weights, in
   interleaved rounds of steps (scripts/bench_variants.py's and bench_train.py's): tokens/s, MFU against the
   bf16 dense peak, peak memory.
4. compiled_vs_eager: train.py's run of the GPU recipe with the fused RMSNorm, 20 steps compiled and 20 eager:
   the losses agree within bf16 tolerance, and the Triton kernel ran inside the compiled model.
5. distributed: FSDP2 and DDP through torchrun, on NCCL, at the number of GPUs here (one is a world): a few
   steps each, FSDP's sharded checkpoint resumed to the same losses, rank 0's memory against DDP's.

Every number is written with its unit and the baseline it is compared with, measured in the same run, to
<out>/<device>-<date>.json and a Markdown table beside it (also printed), both rewritten after every stage.

--dry-run takes every stage's code path on this CPU: tiny shapes and model=tiny, a step or two, gloo instead of
NCCL, the fused kernel in Triton's interpreter, a trivial pytest selection, and aot_eager instead of inductor
(the same tracing and autograd without the code generation, which takes half a minute per model on a CPU).
The suite runs it (tests/e2e/test_gpu_check.py), so that a bug costs CPU time, not a lent GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import importlib.metadata
import itertools
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from bench_train import hf_model, train_step
from bench_variants import Variant, summarize
from hydra import compose, initialize_config_dir

from lab.bench_norms import PASSES, build, bytes_moved, call_time, kernel_time, time_passes, unavailable
from norms import build_norm
from training.config import typed_config
from training.run.setup import configure_device
from training.step.optim import memory_per_rank
from training.telemetry.metrics_file import read_metrics
from training.telemetry.throughput import mfu_or_none, peak_flops, peak_memory_gb

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # train.py sits in the repository root, not in a package
import train as train_script  # noqa: E402

DTYPE = torch.bfloat16
# RMSNorm, with the residual add fused, partial (pRMSNorm), and QK-norm (RMSNorm over each head's head_dim).
KINDS = ("rmsnorm", "residual", "partial", "qk")
# (kind, (rows, D)) in order of value, since the share may run out: every kind at gpu_125m's activations (32
# sequences of 1024 tokens at D = 768; QK-norm over its 12 query heads of 64), RMSNorm over 16k-token batches from
# D = 1k to 16k, the residual and partial forms at 4k, and QK-norm at a head_dim of 128 (16k tokens, 8 heads).
KERNEL_COMPARISONS = [
    *((kind, (32768, 768)) for kind in KINDS[:3]),
    ("qk", (32768 * 12, 64)),
    *(("rmsnorm", (16384, dim)) for dim in (1024, 2048, 4096, 8192, 16384)),
    *((kind, (16384, 4096)) for kind in KINDS[1:3]),
    ("qk", (16384 * 8, 128)),
]
DRY_KERNEL_COMPARISONS = [*((kind, (48, 96)) for kind in KINDS[:3]), ("qk", (96, 16))]
# Per contender and round: do_bench's milliseconds of timed kernel calls, and back-to-back calls for the call time.
KERNEL_REP_MS, CALLS, KERNEL_ROUNDS = 20, 20, 3
# The recipe the README gives for GPUs, and the dry run's stand-in.
RECIPE = ["model=gpu_125m", "train=gpu", "logger=none"]
DRY_RECIPE = ["model=tiny", "train=gpu", "logger=none", "device=cpu", "train.batch_size=2", "train.seq_len=16",
              "data.val_windows=2", "train.perf_warmup_steps=1", "train.peak_flops=1e11"]  # fmt: skip
NORMS = (
    "rmsnorm",
    "fused_rmsnorm",
    "layernorm",
    "prmsnorm",
)  # training's, in order of value; the first is the baseline
# Losses of bf16 runs that sum in another order (compiled against eager) drift apart over steps: bf16 keeps 8
# significant bits (0.4%), and the difference compounds through the updates.
BF16_RTOL = 2e-2
RESUME_RTOL = 1e-3  # a resumed run repeats the same kernels on the same data: only atomics may reorder sums


class OutOfTime(BaseException):
    """A stage's share of the budget ran out (raised by the timer in the main thread; a BaseException, so that
    no ``except Exception`` on the way swallows it)."""


class CheckFailed(Exception):
    """A stage found something wrong; the message is its one-line error."""


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
        ``where`` adds keys for readers (a kernel's implementation, shape and pass)."""
        if not math.isfinite(value):
            raise CheckFailed(f"{name} is {value}")
        number = {"name": name, "value": value, "unit": unit, "baseline": baseline, "ratio": ratio}
        self.numbers.append({**number, **(where or {})})


# --- running stages and commands ----------------------------------------------------------------------------


def _out_of_time(signum, frame):
    raise OutOfTime


def run_stage(function: Callable[[Stage], None], stage: Stage) -> dict:
    """Run one stage until it ends or its share runs out; its record: status, reason or error, time, findings."""
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
    except Exception as err:  # the stage's error, in one line; the next stage runs all the same
        record.update(status="failed", error=str(err) if isinstance(err, CheckFailed) else one_line(err))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        torch._dynamo.reset()  # each stage compiles its own models; stale entries would count against its limits
        gc.collect()
        if stage.device.type == "cuda":
            torch.cuda.empty_cache()
    seconds = round(time.monotonic() - started, 1)
    return {
        **record,
        "seconds": seconds,
        "share_s": round(stage.share_s, 1),
        "numbers": stage.numbers,
        "notes": stage.notes,
    }


def one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:500]


def error_line(output: str) -> str:
    """The line of a process's output that says what went wrong: its last exception or error line, else its last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line) or "[ERROR]" in line]
    return (errors or lines or ["(no output)"])[-1][:500]


def run_at_once(
    stage: Stage, commands: dict[str, list[str]], meanwhile: Callable[[], object] | None = None
) -> dict[str, tuple[int, str]]:
    """Run the commands at once from the repository root, each logging to ``<stage>-<name>.log`` in the scratch
    folder, and ``meanwhile`` in this process; (exit code, output) of each command. When the stage's share runs
    out, or this script is stopped, each is stopped with all it started: SIGTERM to its process group (torchrun
    passes it on to its workers), then SIGKILL."""
    logs = {name: stage.scratch / f"{stage.name}-{name}.log" for name in commands}
    processes: list[subprocess.Popen] = []
    try:
        for name, command in commands.items():
            with open(logs[name], "w") as log:
                processes.append(
                    subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                )
        if meanwhile is not None:
            meanwhile()
        codes = [process.wait() for process in processes]
    except BaseException:
        stop(processes)
        raise
    return {name: (code, logs[name].read_text()) for name, code in zip(commands, codes)}


def stop(processes: list[subprocess.Popen], grace_s: float = 10) -> None:
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


def launched(
    stage: Stage, commands: dict[str, list[str]], meanwhile: Callable[[], object] | None = None
) -> dict[str, str]:
    """run_at_once's outputs, once every command exited 0 (else the first failure's error line)."""
    results = run_at_once(stage, commands, meanwhile)
    for name, (code, output) in results.items():
        if code != 0:
            raise CheckFailed(f"the {name} launch exited {code}: {error_line(output)}")
    return {name: output for name, (_, output) in results.items()}


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


def compose_config(overrides: list[str]):
    """The typed run config ``overrides`` compose, as train.py passes it on."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return typed_config(compose("config", overrides=overrides))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- 1. correctness -----------------------------------------------------------------------------------------

OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "with errors", "SKIPPED": "skipped"}


def gpu_test_files() -> list[str]:
    """The test files that mark tests ``gpu``: collecting only these keeps other files' packages (the browser
    tests') out of a GPU machine's run."""
    files = (ROOT / "tests").rglob("test_*.py")
    return sorted(str(path.relative_to(ROOT)) for path in files if "mark.gpu" in path.read_text())


def correctness(stage: Stage) -> None:
    if stage.dry_run:  # one test that runs here, one that needs a GPU and is skipped
        selection = ["-n", "0", "tests/unit/norms/test_fused.py", "-k", "interpreter_backend or more_than_2_31"]
    else:  # Triton compiles each kernel variant on a CPU core: a worker per two cores, tests spread one by one
        workers = max(1, min(8, (os.cpu_count() or 2) // 2))
        selection = ["-n", str(workers), "--dist", "load", "-m", "gpu", *gpu_test_files()]
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *selection]
    try:
        ((code, output),) = run_at_once(stage, {"pytest": command}).values()
    except OutOfTime:
        count_tests(stage, (stage.scratch / f"{stage.name}-pytest.log").read_text())  # the tests that finished
        raise
    outcomes, reasons, broken_files = count_tests(stage, output)
    if broken_files:
        raise CheckFailed(f"{len(broken_files)} test file(s) did not import: {next(iter(broken_files.items()))}")
    if not outcomes:
        raise CheckFailed(f"pytest ran no test (exit {code}): {error_line(output)}")
    failed = [test for test, outcome in outcomes.items() if outcome in ("FAILED", "ERROR")]
    if failed:
        raise CheckFailed(f"{len(failed)} of {len(outcomes)} failed, first {failed[0]}: {reasons.get(failed[0], '')}")


def count_tests(stage: Stage, output: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Each test's outcome from pytest -v's lines (with or without xdist), recorded as numbers; the failures'
    one-line reasons; files that did not import."""
    outcomes = {}
    for line in output.splitlines():
        test, outcome = re.search(r"\S+::\S+", line), re.search(rf"\b({'|'.join(OUTCOMES)})\b", line)
        if test and outcome:
            outcomes[test.group()] = outcome.group(1)
    reasons = dict(re.findall(r"^(?:FAILED|ERROR) (\S+::\S+) - (.*)$", output, re.MULTILINE))
    broken_files = dict(re.findall(r"^ERROR (\S+\.py)(?: - (.*))?$", output, re.MULTILINE))
    stage.numbers.clear()
    for outcome, label in OUTCOMES.items():
        count = sum(o == outcome for o in outcomes.values())
        ratio = count / len(outcomes) if outcomes else None
        stage.number(f"tests {label}", count, "tests", f"tests run: {len(outcomes)}", ratio)
    stage.progress = f"{len(outcomes)} tests had finished"
    return outcomes, reasons, broken_files


# --- 2. kernel bandwidth ------------------------------------------------------------------------------------


def traffic(rows: int, dim: int, element: int, residual: bool) -> dict[str, int]:
    """Bytes each pass must move at the least: bench_norms's count, plus, with a residual, the residual read and
    the sum written forward and the sum's gradient read backward. The unfused forms are credited the same bytes,
    so that the bandwidths' ratio is their speed's."""
    moved = bytes_moved(rows, dim, element)
    if residual:
        tensor = rows * dim * element
        moved = {
            "fwd": moved["fwd"] + 2 * tensor,
            "bwd": moved["bwd"] + tensor,
            "fwd+bwd": moved["fwd+bwd"] + 3 * tensor,
        }
    return moved


def kernel_contenders(kind: str, dim: int, residual: torch.Tensor, device: torch.device) -> dict[str, Callable]:
    """The implementations compared for one kind of norm at hidden size ``dim``; the first is the reference."""

    def make(name: str) -> torch.nn.Module:
        return build(name, dim, device, DTYPE)

    if kind in ("rmsnorm", "qk"):  # QK-norm is RMSNorm over many short rows: the same contenders
        found = {
            "F.rms_norm": make("torch_rmsnorm"),
            "fused_rmsnorm": make("fused_rmsnorm"),
            "rmsnorm, torch.compile": make("compiled_rmsnorm"),
        }
        if kind == "rmsnorm":
            found["F.layer_norm"] = make("torch_layernorm")
        if unavailable("liger_rmsnorm", device) is None:
            found["liger_rmsnorm"] = make("liger_rmsnorm")
        return found
    if kind == "residual":  # each returns (norm(x + r), x + r), as the blocks use it
        eager, fused, compiled = make("torch_rmsnorm"), make("fused_rmsnorm"), make("compiled_rmsnorm")

        def unfused(x):
            total = x + residual
            return eager(total), total

        return {
            "x + r, then F.rms_norm": unfused,
            "fused_rmsnorm(x, residual=r)": lambda x: fused(x, residual=residual),
            "rmsnorm(x, residual=r), torch.compile": lambda x: compiled(x, residual=residual),
        }
    eager = make("prmsnorm")  # kind == "partial": the statistic over the first k = ceil(p * D) features
    fused = build_norm("fused_rmsnorm", dim, k=eager.k).to(device, DTYPE)
    return {"prmsnorm (eager)": eager, "fused prmsnorm": fused, "prmsnorm, torch.compile": make("compiled_prmsnorm")}


TIMINGS = ("kernel", "call")


def copy_seconds(x: torch.Tensor, out: torch.Tensor, device: torch.device, reps: int) -> dict[str, float]:
    return {"copy": kernel_time(functools.partial(out.copy_, x), device, reps)}


def both_timings(fn: Callable, x: torch.Tensor, grads, device: torch.device, reps: int, calls: int) -> dict:
    """Seconds of each pass, as "<timing> <pass>": the kernel time and the call time (analysis/bench_norms.py)."""
    kernel = time_passes(fn, x, grads, device, kernel_time, reps)
    call = time_passes(fn, x, grads, device, call_time, calls)
    return {f"{timing} {p}": seconds[p] for timing, seconds in (("kernel", kernel), ("call", call)) for p in PASSES}


def kernel_bandwidth(stage: Stage) -> None:
    device = stage.device
    reps, calls, rounds = (1, 2, 2) if stage.dry_run else (KERNEL_REP_MS, CALLS, KERNEL_ROUNDS)
    comparisons = DRY_KERNEL_COMPARISONS if stage.dry_run else KERNEL_COMPARISONS
    liger = unavailable("liger_rmsnorm", device)
    if liger:
        stage.notes["liger_rmsnorm"] = f"left out: {liger}"
    if device.type == "cuda":
        stage.notes["timing"] = (
            f"{rounds} interleaved rounds, {str(DTYPE)[6:]}; kernel time: triton.testing.do_bench, {reps} ms of "
            f"calls, the L2 flushed before each, median; call time: {calls} calls back to back, host included; "
            "backward = forward+backward - forward (the forward records the graph, as in training)"
        )
    else:
        stage.notes["timing"] = (
            "a CPU dry run: the 'kernel' time is perf_counter around each call and the fused norm runs in Triton's "
            "interpreter, so these numbers exercise the code and say nothing of a GPU's speed"
        )
    for done, (kind, (rows, dim)) in enumerate(comparisons):
        stage.progress = f"{done} of {len(comparisons)} comparisons measured"
        x = torch.randn(rows, dim, device=device, dtype=DTYPE)
        grads = (torch.randn_like(x), torch.randn_like(x)) if kind == "residual" else torch.randn_like(x)
        out = torch.empty_like(x)
        contenders = kernel_contenders(kind, dim, torch.randn_like(x), device)
        jobs = {"copy": functools.partial(copy_seconds, x, out, device, reps)}
        jobs |= {
            name: functools.partial(both_timings, fn, x, grads, device, reps, calls) for name, fn in contenders.items()
        }
        runs = interleaved(jobs, rounds, stage)
        seconds = {
            name: {key: statistics.median(r[key] for r in per_round) for key in per_round[0]}
            for name, per_round in runs.items()
        }
        shape, where = f"{rows}x{dim}", {"kind": kind, "shape": [rows, dim]}
        copy = 2 * x.nbytes / seconds.pop("copy")["copy"] / 1e9
        ceiling = "none: the ceiling of_copy divides by"
        copy_where = {**where, "impl": "device copy", "pass": "copy", "timing": "kernel"}
        stage.number(f"device copy {shape}", copy, "GB/s", ceiling, None, copy_where)
        moved = traffic(rows, dim, x.element_size(), kind == "residual")
        reference = next(iter(contenders))
        for name, timing, pass_name in itertools.product(contenders, TIMINGS, PASSES):
            key = f"{timing} {pass_name}"
            gbps = moved[pass_name] / seconds[name][key] / 1e9
            speedup = seconds[reference][key] / seconds[name][key]
            found = {**where, "impl": name, "pass": pass_name, "timing": timing, "of_copy": gbps / copy}
            found["ms"] = 1000 * seconds[name][key]
            stage.number(f"{name} {shape} {pass_name}, {timing} time", gbps, "GB/s", reference, speedup, found)


# --- 3. training --------------------------------------------------------------------------------------------


class HFLlama:
    """Hugging Face's LlamaForCausalLM with a Variant's shape and weights, taking bench_train.py's step (eager,
    in the Variant's autocast); steps like a Variant."""

    label = "hf_llama, eager"
    backends = ["transformers"]

    def __init__(self, ours: Variant, device: torch.device) -> None:
        self.model = hf_model(ours.model.cfg, ours.model).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        self.autocast = ours.autocast

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:  # HF shifts the labels inside: the same predictions
        return self.model(input_ids=tokens[:, :-1], labels=tokens[:, :-1], use_cache=False).loss

    def steps(self, tokens: torch.Tensor, count: int) -> None:
        for _ in range(count):
            train_step(self.loss, self.optimizer, tokens, self.autocast)
        sync(tokens.device)


def timed_steps(contender, tokens: torch.Tensor, steps: int) -> dict[str, float]:
    """Seconds of ``steps`` training steps, and the peak memory they reached: on CUDA the allocator's peak above
    what every model held before, plus what this one holds at rest (weights, optimizer moments), which is its
    peak had it been alone; on a CPU the process's peak resident set, all models together."""
    device = tokens.device
    sync(device)
    if device.type == "cuda":
        at_rest = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    contender.steps(tokens, steps)
    seconds = time.perf_counter() - started
    if device.type != "cuda":
        return {"seconds": seconds, "peak_bytes": peak_memory_gb(device) * 1e9}
    held = memory_per_rank(contender.model, contender.optimizer)
    peak = torch.cuda.max_memory_allocated(device) - at_rest + held["param_bytes"] + held["optimizer_state_bytes"]
    return {"seconds": seconds, "peak_bytes": peak}


def training(stage: Stage) -> None:
    device = stage.device
    configure_device(device)  # TF32 matmuls, as train.py sets them
    cfg = compose_config(stage.overrides)
    seq_len = cfg.train.seq_len or cfg.model.max_seq_len
    generator = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, cfg.data.vocab_size, (cfg.train.batch_size, seq_len + 1), generator=generator)
    tokens = tokens.to(device)
    warmup, steps, rounds = (1, 1, 2) if stage.dry_run else (3, 5, 5)
    baseline, *others = [Variant(stage.overrides, f"norm={norm}", device) for norm in NORMS]
    eager = Variant(stage.overrides, "norm=rmsnorm train.compile=false", device)
    eager.label = "rmsnorm, eager"
    # Warmed up in this order: the baseline, then the two that take no compiling, then the other compiled norms.
    contenders = [baseline, eager, HFLlama(baseline, device), *others]
    compiled = baseline.step_model is not baseline.model
    stage.notes["model"] = (
        f"{cfg.model.name}, {sum(p.numel() for p in baseline.model.parameters()):,} parameters, batch "
        f"{tokens.shape[0]}x{seq_len}, {baseline.precision}; the norms' models "
        f"{'compiled, as train=gpu runs them' if compiled else 'eager (train=gpu compiles on CUDA only)'}"
    )
    stage.notes["norm backends"] = "; ".join(f"{c.label}: {', '.join(c.backends)}" for c in contenders)

    warmed: dict[str, float] = {}  # the first steps compile: the slowest so far foretells the next
    for contender in list(contenders):
        slowest = max(warmed.values(), default=0.0)
        if warmed and stage.left() - slowest < 0.25 * stage.share_s:  # keep a quarter of the share for the rounds
            contenders.remove(contender)
            stage.notes[contender.label] = (
                f"left out: one more warm-up (the slowest took {slowest:.0f} s) would leave the timed rounds less "
                "than a quarter of the share"
            )
            continue
        started = time.perf_counter()
        contender.steps(tokens, warmup)
        warmed[contender.label] = time.perf_counter() - started
        stage.progress = f"{len(warmed)} of {len(NORMS) + 2} models warmed up"
    runs = interleaved({c.label: functools.partial(timed_steps, c, tokens, steps) for c in contenders}, rounds, stage)
    stage.notes["rounds"] = f"{len(runs[baseline.label])} interleaved rounds of {steps} steps after {warmup} warm-up"

    tokens_per_round = steps * tokens.shape[0] * seq_len
    rates = {label: [tokens_per_round / r["seconds"] for r in per_round] for label, per_round in runs.items()}
    peak_bytes = {label: max(r["peak_bytes"] for r in per_round) for label, per_round in runs.items()}
    peak = peak_flops(device, baseline.precision, cfg.train.peak_flops)
    flops_per_token = baseline.model.flops_per_token(seq_len)
    base = baseline.label
    for row in summarize(rates, base):
        label = row["variant"]
        stage.number(f"tokens/s, {label}", row["tokens_per_sec"], "tokens/s", f"{base}, same rounds", row["ratio"])
        stage.number(
            f"model FLOP/s, {label}",
            row["tokens_per_sec"] * flops_per_token / 1e12,
            "TFLOP/s",
            f"{baseline.precision} dense peak, {peak.source}: {peak.flops / 1e12:.1f} TFLOP/s",
            mfu_or_none(row["tokens_per_sec"], flops_per_token, peak.flops),
        )
        stage.number(
            f"peak memory, {label}", peak_bytes[label] / 1e9, "GB", f"{base}'s", peak_bytes[label] / peak_bytes[base]
        )
        stage.number(f"warm-up, {label}", warmed[label], "s", f"{base}'s ({warmup} steps each, compiling included)",
                     warmed[label] / warmed[base])  # fmt: skip


# --- 4. compiled against eager ------------------------------------------------------------------------------


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


def compiled_vs_eager(stage: Stage) -> None:
    steps = 3 if stage.dry_run else 20
    batch = one_batch_per_step(stage)
    # A short warm-up, so that the 20 steps train at the recipe's rate and a wrong compiled gradient would show.
    overrides = [*stage.overrides, "norm=fused_rmsnorm", f"train.max_steps={steps}", "train.warmup_steps=2",
                 "train.log_every=1", batch]  # fmt: skip
    stage.notes["runs"] = f"{steps} steps of norm=fused_rmsnorm each, one micro-batch a step, train.warmup_steps=2"
    dirs = {mode: stage.scratch / f"{stage.name}-{mode}" for mode in ("eager", "compiled")}
    for mode, run_dir in dirs.items():
        stage.progress = f"training {mode}"
        train_script.train(compose_config([*overrides, f"train.compile={mode == 'compiled'}"]), run_dir)
    got, expected = losses(dirs["compiled"]), losses(dirs["eager"])
    if sorted(got) != list(range(1, steps + 1)) or sorted(expected) != sorted(got):
        raise CheckFailed(f"logged losses at steps {sorted(got)} compiled and {sorted(expected)} eager, not 1-{steps}")
    worst = max(abs(got[s] - expected[s]) / abs(expected[s]) for s in got)
    stage.number(
        f"largest relative loss difference over {steps} steps",
        worst,
        "relative",
        f"bf16 tolerance {BF16_RTOL}",
        worst / BF16_RTOL,
    )
    for name, key, unit in [
        ("training loss at the last step", "train/loss", "nats"),
        ("validation loss", "val/loss", "nats"),
        ("tokens/s", "perf/tokens_per_sec", "tokens/s"),
    ]:
        value, eager = last(dirs["compiled"], key), last(dirs["eager"], key)
        stage.number(f"{name}, compiled", value, unit, f"eager: {eager:,.4g}", value / eager)
    record = runtime(dirs["compiled"])
    backends = sorted(set(record["norm_backend"].values()))
    stage.notes["compiled run"] = f"compiled: {record['compiled']}; norm backends: {', '.join(backends)}"
    kernel = "triton-interpreter" if stage.dry_run else "triton"
    if not record["compiled"] or backends != [kernel]:
        raise CheckFailed(f"the compiled run's norms ran on {backends} (compiled: {record['compiled']}), not {kernel}")
    if worst > BF16_RTOL:
        raise CheckFailed(f"compiled and eager losses differ by {worst:.3g} (relative) > {BF16_RTOL}")


# --- 5. distributed -----------------------------------------------------------------------------------------


def distributed(stage: Stage) -> None:
    world = torch.cuda.device_count() if stage.device.type == "cuda" else 1
    steps = 4 if stage.dry_run else 6
    saved_at = steps // 2
    batch = one_batch_per_step(stage, world)
    # Eager: compiled training is stage 4's, and each launch would compile anew.
    overrides = [*stage.overrides, "norm=fused_rmsnorm", f"train.max_steps={steps}", "train.log_every=1", batch,
                 f"train.checkpoint_every={saved_at}", "train.compile=false", "train.dist_timeout_s=120"]  # fmt: skip
    backend = "NCCL" if stage.device.type == "cuda" else "gloo"
    stage.notes["runs"] = f"{steps} eager steps of norm=fused_rmsnorm, one micro-batch per process, on {backend}"

    def torchrun(mode: str, run_dir: Path) -> list[str]:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
        return [*launcher, "train.py", *overrides, f"train.parallel={mode}", f"hydra.run.dir={run_dir}"]

    def here(mode: str, run_dir: Path) -> Callable[[], dict]:
        return functools.partial(train_script.train, compose_config([*overrides, f"train.parallel={mode}"]), run_dir)

    fsdp, ddp, resumed = (stage.scratch / f"{stage.name}-{name}" for name in ("fsdp", "ddp", "fsdp-resumed"))
    stage.progress = "FSDP and DDP training"
    # The dry run launches FSDP alone (a launch costs ~10 s of a 2-core CPU): at a world of one, train.py runs DDP
    # as one plain process and resumes a sharded checkpoint without torchrun, so those two train in this process.
    if stage.dry_run:
        outputs = launched(stage, {"fsdp": torchrun("fsdp", fsdp)}, meanwhile=here("ddp", ddp))
    else:
        outputs = launched(stage, {"fsdp": torchrun("fsdp", fsdp), "ddp": torchrun("ddp", ddp)})
    stage.notes["launches"] = f"torchrun --nproc_per_node={world}: {'FSDP' if stage.dry_run else 'FSDP, DDP, resume'}"
    policy = re.search(r"computing in (\S+); (\d+) norm modules' parameters float32", outputs["fsdp"])
    if policy is None:
        raise CheckFailed("FSDP's launch did not log its mixed-precision policy: was it sharded?")
    kept, norms = int(policy[2]), len(runtime(fsdp)["norm_roles"])
    stage.notes["FSDP policy"] = f"the blocks compute in {policy[1]}"
    stage.number("norms with float32 parameters, FSDP", kept, "modules", f"norms in the model: {norms}", kept / norms)
    expected = "torch.bfloat16" if stage.device.type == "cuda" else "float32"
    if policy[1] != expected or kept != norms:
        raise CheckFailed(f"FSDP computed in {policy[1]} with {kept} of {norms} norms float32; {expected} expected")
    for key, value in runtime(fsdp)["memory_per_rank"].items():  # param_bytes, grad_bytes, optimizer_state_bytes
        held = runtime(ddp)["memory_per_rank"][key]
        stage.number(f"{key.removesuffix('_bytes')} bytes, rank 0, FSDP", value / 2**20, "MiB",
                     f"DDP's: {held / 2**20:,.1f}", value / held)  # fmt: skip
    peak, held = last(fsdp, "perf/peak_mem_gb"), last(ddp, "perf/peak_mem_gb")
    stage.number("peak memory, rank 0, FSDP", peak, "GB", f"DDP's: {held:.3f}", peak / held)
    loss, ddp_loss = losses(fsdp)[steps], losses(ddp)[steps]
    stage.number(f"training loss at step {steps}, FSDP", loss, "nats", f"DDP's: {ddp_loss:.4f}", loss / ddp_loss)

    checkpoints = sorted((fsdp / "checkpoints").iterdir())
    if not checkpoints or any(path.suffix != ".dcp" for path in checkpoints):
        raise CheckFailed(f"FSDP's checkpoints are {[p.name for p in checkpoints]}, not sharded (step_*.dcp)")
    shutil.copytree(fsdp, resumed)  # as if stopped after its checkpoint at saved_at: the later ones removed
    for later in (resumed / "checkpoints").iterdir():
        if int(later.stem.split("_")[1]) > saved_at:
            shutil.rmtree(later)
    stage.progress = f"FSDP resuming from step {saved_at}"
    if stage.dry_run:
        here("fsdp", resumed)()
    else:
        launched(stage, {"resume": torchrun("fsdp", resumed)})
    resumes = yaml.safe_load((resumed / "config.yaml").read_text()).get("resumes") or []
    if [entry["step"] for entry in resumes] != [saved_at]:
        raise CheckFailed(f"the rerun did not resume from step {saved_at}: its record's resumes are {resumes}")
    got, uninterrupted = losses(resumed), losses(fsdp)
    worst = max(abs(got[s] - uninterrupted[s]) / abs(uninterrupted[s]) for s in range(saved_at + 1, steps + 1))
    stage.number(f"largest relative loss difference, resumed at step {saved_at}, against uninterrupted", worst,
                 "relative", f"tolerance {RESUME_RTOL}", worst / RESUME_RTOL)  # fmt: skip
    if worst > RESUME_RTOL:
        raise CheckFailed(f"the resumed run's losses differ from the uninterrupted run's by {worst:.3g} (relative)")


# --- the report ---------------------------------------------------------------------------------------------

STAGES = [  # (stage, share of the budget): the Triton compiles of stage 1 and the model compiles of 3 take longest
    (correctness, 0.25),
    (kernel_bandwidth, 0.15),
    (training, 0.30),
    (compiled_vs_eager, 0.12),
    (distributed, 0.18),
]


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_output(*command: str) -> str | None:
    """The first line a command prints, or None where it cannot run."""
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None


def environment(device: torch.device, args: argparse.Namespace, argv: list[str]) -> dict:
    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "gpus": torch.cuda.device_count(),
        "driver": command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": package_version("triton"),
        "liger_kernel": package_version("liger-kernel"),
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
        "commit": command_output("git", "describe", "--always", "--dirty"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dry_run": args.dry_run,
        "budget_s": args.budget_s,
        "command": " ".join(["python", "scripts/gpu_check.py", *argv]),
    }


def format_value(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def numbers_table(numbers: list[dict]) -> list[str]:
    lines = ["| what | value | unit | against | ratio |", "|---|---|---|---|---|"]
    for n in numbers:
        ratio = "–" if n["ratio"] is None else f"{n['ratio']:.3f}"
        lines.append(f"| {n['name']} | {format_value(n['value'])} | {n['unit']} | {n['baseline']} | {ratio} |")
    return lines


def bandwidth_table(numbers: list[dict]) -> list[str]:
    """The kernel numbers, a row per implementation, shape and timing: GB/s, × its reference, and % of the copy."""
    copies = {(n["kind"], tuple(n["shape"])): n["value"] for n in numbers if n["pass"] == "copy"}
    rows: dict[tuple, list[str]] = {}
    for n in numbers:
        if n["pass"] != "copy":
            cell = f"{format_value(n['value'])} ×{n['ratio']:.2f} ({n['of_copy']:.0%})"
            key = (n["impl"], n["kind"], tuple(n["shape"]), n.get("timing", "kernel"), n["baseline"])
            rows.setdefault(key, []).append(cell)
    lines = [
        "Each pass: GB/s, ×the reference's speed in the same timing, (% of a device copy's bandwidth). Kernel: the",
        "device's time for a call, the L2 flushed before it; call: back-to-back eager calls, host included.",
        "",
        f"| implementation | rows x D | timing | {' | '.join(PASSES)} | reference; copy |",
        "|---|---|---|---|---|---|---|",
    ]
    for (impl, kind, shape, timing, reference), cells in rows.items():
        copy = f"{format_value(copies[kind, shape])} GB/s"
        lines.append(f"| {impl} | {shape[0]}x{shape[1]} | {timing} | {' | '.join(cells)} | {reference}; {copy} |")
    return lines


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        f"# GPU check: {meta['device']}, {meta['date'][:10]}{' (dry run)' if meta['dry_run'] else ''}",
        "",
        f"`{meta['command']}`: {meta['gpus']} GPU(s), driver {meta['driver'] or '–'}, torch {meta['torch']} "
        f"(CUDA {meta['cuda'] or '–'}), Triton {meta['triton'] or '–'}, Liger {meta['liger_kernel'] or '–'}, "
        f"commit {meta['commit'] or '–'}; a budget of {meta['budget_s']:.0f} s.",
        "",
        "| stage | status | time / share | why |",
        "|---|---|---|---|",
    ]
    for stage in report["stages"]:
        why = stage.get("error") or stage.get("reason") or ""
        lines.append(
            f"| {stage['name']} | {stage['status']} | {stage['seconds']:.0f} / {stage['share_s']:.0f} s | {why} |"
        )
    for stage in report["stages"]:
        lines += ["", f"## {stage['name']}", ""]
        lines += [f"- {key}: {value}" for key, value in stage["notes"].items()]
        numbers = stage["numbers"]
        if numbers:
            lines += ["", *(bandwidth_table if "pass" in numbers[0] else numbers_table)(numbers)]
    return "\n".join(lines) + "\n"


def status_line(record: dict) -> str:
    why = record.get("error") or record.get("reason")
    return f"{record['name']}: {record['status']} in {record['seconds']:.0f} s" + (f": {why}" if why else "")


def arguments_refusal(budget_s: float, out: Path) -> str | None:
    """Why the command line cannot work, in one line, or None: a budget that is not a positive number of seconds,
    an output folder that is a file, a link or not writable."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        return f"--budget-s {budget_s} is not a number of seconds > 0: give the time all stages may take, e.g. 480"
    if out.is_symlink():
        return f"--out {out} is a link to {os.readlink(out)}: give the folder itself"
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a folder: give a folder for the JSON and the table"
    existing = next(parent for parent in (out, *out.parents) if parent.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"--out {out}: {existing} is not writable: give a folder this user can write"
    return None


def _terminated(signum, frame):
    sys.exit(128 + signum)  # unwinds like an exception, so that run_at_once stops the processes it started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every training run (stages 3-5)")
    parser.add_argument("--budget-s", type=float, default=480, help="seconds for all stages together (default 480)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSON and the table (default docs/benchmarks/gpu; bench_out/gpu_check for a dry run)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="every stage's code on this CPU, tiny, in about a minute"
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    out = args.out or ROOT / ("bench_out/gpu_check" if args.dry_run else "docs/benchmarks/gpu")
    refusal = arguments_refusal(args.budget_s, out)
    if refusal:  # before the first stage: a lent GPU's minutes are the scarcest thing this command spends
        print(f"gpu_check: {refusal}", file=sys.stderr)
        return 2
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run, for this process and what it starts, even beside a GPU
        os.environ["TRITON_INTERPRET"] = "1"  # read when the fused kernel loads: Triton's interpreter on CPU tensors
        torch.compile = functools.partial(torch.compile, backend="aot_eager")
    elif not torch.cuda.is_available():
        print(
            "gpu_check: needs a CUDA GPU and torch sees none here; `python scripts/gpu_check.py --dry-run` runs "
            "every stage's code on this CPU",
            file=sys.stderr,
        )
        return 1
    signal.signal(signal.SIGTERM, _terminated)
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    overrides = [*(DRY_RECIPE if args.dry_run else RECIPE), *args.overrides]
    report = {"meta": environment(device, args, argv), "stages": []}
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", report["meta"]["device"].lower()).strip("-")
    json_path = out / f"{slug}-{report['meta']['date'][:10]}.json"

    started, share_end = time.monotonic(), 0.0
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as scratch:
        for index, (function, share) in enumerate(STAGES, 1):
            share_end += share * args.budget_s  # a stage may use what the ones before it left
            deadline, share_s = started + share_end, share * args.budget_s
            stage = Stage(function.__name__, device, args.dry_run, overrides, Path(scratch), deadline, share_s)
            print(f"[{index}/{len(STAGES)}] {stage.name}: until {share_end:.0f} s of {args.budget_s:.0f}", flush=True)
            report["stages"].append(run_stage(function, stage))
            print(f"    {status_line(report['stages'][-1])}", flush=True)
            json_path.write_text(json.dumps(report, indent=1) + "\n")  # rewritten after each stage: a killed run
            json_path.with_suffix(".md").write_text(markdown(report))  # leaves what it had found
    print(markdown(report))  # then the verdicts again, last, where a truncated log still shows them
    print("\n".join(status_line(record) for record in report["stages"]))
    print(f"wrote {json_path} and {json_path.with_suffix('.md')}")
    return 1 if any(stage["status"] == "failed" for stage in report["stages"]) else 0


if __name__ == "__main__":
    sys.exit(main())
