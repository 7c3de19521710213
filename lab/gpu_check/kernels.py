"""Stage 2, kernels: the fused RMSNorm against eager F.rms_norm, RMSNorm under torch.compile, F.layer_norm and
Liger's RMSNorm (when installed), in bfloat16 at rows x D of training batches from D = 768 to 16,384, forward,
backward and both, timed twice (lab/bench_norms.py, interleaved rounds): the kernel time (do_bench, the L2
flushed before each call) and the call time an eager loop pays (back-to-back calls, host included). GB/s against
the reference, and as a fraction of a device copy measured alongside. Then the residual-add and partial forms
against their unfused equivalents, and QK-norm's many short rows (head_dim 64 and 128)."""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Callable

import torch

from lab.bench_norms import PASSES, build, bytes_moved, call_time, kernel_time, time_passes, unavailable
from lab.gpu_check.stage import Stage, interleaved
from norms import build_norm

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
    """Seconds of each pass, as "<timing> <pass>": the kernel time and the call time (lab/bench_norms.py)."""
    kernel = time_passes(fn, x, grads, device, kernel_time, reps)
    call = time_passes(fn, x, grads, device, call_time, calls)
    return {f"{timing} {p}": seconds[p] for timing, seconds in (("kernel", kernel), ("call", call)) for p in PASSES}


def kernels(stage: Stage) -> None:
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
