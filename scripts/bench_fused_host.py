"""Host cost per call of the fused RMSNorm, its kernel launches stubbed, as a ratio to F.rms_norm's whole call.

    python scripts/bench_fused_host.py                          # D = 64, 768, 4096, 16384
    python scripts/bench_fused_host.py --dims 768 --rounds 5 --calls 500

What a call costs on the host, before any GPU work: argument checks, the cached launch settings,
the output allocations, autograd's bookkeeping, and building the launch's arguments. Measured on
CPU tensors with the Triton launches replaced by a no-op (the outputs are still allocated as the
real path allocates them), so the number is the Python and ATen work of the call alone; Triton's
own launcher (argument specialization, its cache lookup, cuLaunchKernel) is not in it. The
baseline is ``F.rms_norm``'s whole call on the same tensors (on CPU its composite ATen kernel,
compute included), and ``x + r`` then ``F.rms_norm`` for the residual form. Passes: the forward as
training runs it (inputs that require grad, a graph recorded), the forward under no_grad, and
forward then backward. Rows are few (--rows, default 1) so that the baseline's arithmetic stays
small next to its host cost. Each contender runs --calls calls a round, in --rounds interleaved
rounds whose order rotates; the number is the median over rounds.

Output: a table on stdout (per-call microseconds and the ratio), and the same as JSON with --json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before norms loads: the fused path's backend on CPU tensors

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import norms.fused.ops as fused_ops  # noqa: E402
from norms import fused_add_rms_norm, fused_rms_norm  # noqa: E402
from norms.fused import kernels  # noqa: E402

PASSES = ("fwd", "fwd, no grad", "fwd+bwd")
KINDS = ("rmsnorm", "residual")
KERNELS = (
    "rms_norm_fwd_kernel",
    "rms_norm_bwd_kernel",
    "sum_partials_kernel",
    "rms_norm_fwd_looping_kernel",
    "rms_norm_bwd_looping_kernel",
    "rms_norm_bwd_wide_kernel",
)


class _StubbedKernel:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **constants)`` takes the arguments and launches nothing."""

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **constants):
        return None


@contextlib.contextmanager
def stubbed_launches():
    """Every fused kernel replaced by a stub, with the cached launch settings made afresh around it."""
    saved = {name: getattr(kernels, name) for name in KERNELS}
    launches = dict(fused_ops._LAUNCHES)
    try:
        for name in KERNELS:
            setattr(kernels, name, _StubbedKernel())
        fused_ops._LAUNCHES.clear()
        yield
    finally:
        for name, kernel in saved.items():
            setattr(kernels, name, kernel)
        fused_ops._LAUNCHES.clear()
        fused_ops._LAUNCHES.update(launches)


def contenders(kind: str, rows: int, dim: int) -> dict[str, dict[str, Callable[[], object]]]:
    """For one kind at (rows, dim): {implementation: {pass: a call}}, the reference first."""
    x = torch.randn(rows, dim, requires_grad=True)
    residual = torch.randn(rows, dim, requires_grad=True)
    weight = torch.rand(dim, requires_grad=True)
    dy = torch.randn(rows, dim)
    if kind == "rmsnorm":
        calls = {
            "F.rms_norm": lambda: F.rms_norm(x, (dim,), weight, 1e-6),
            "fused_rms_norm": lambda: fused_rms_norm(x, weight, 1e-6),
        }
    else:

        def unfused():
            total = x + residual
            return F.rms_norm(total, (dim,), weight, 1e-6), total

        calls = {
            "x + r, then F.rms_norm": unfused,
            "fused_add_rms_norm": lambda: fused_add_rms_norm(x, residual, weight),
        }

    def passes(call):
        def forward_backward():
            out = call()
            torch.autograd.backward(out[0] if isinstance(out, tuple) else out, dy)

        def no_grad():
            with torch.no_grad():
                call()

        return {"fwd": call, "fwd, no grad": no_grad, "fwd+bwd": forward_backward}

    return {name: passes(call) for name, call in calls.items()}


def per_call_seconds(call: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


def measure(dims, rows: int = 1, rounds: int = 7, calls: int = 300, kinds=KINDS) -> list[dict]:
    """One record per (kind, D, pass, implementation): median microseconds per call over interleaved rounds, and
    the ratio to the kind's reference (its first implementation) measured in the same rounds."""
    records = []
    with stubbed_launches():
        for kind in kinds:
            for dim in dims:
                jobs = {
                    (name, pass_name): call
                    for name, by_pass in contenders(kind, rows, dim).items()
                    for pass_name, call in by_pass.items()
                }
                for call in jobs.values():  # warm-up: the launch settings are cached, autograd's paths warm
                    per_call_seconds(call, max(3, calls // 10))
                times: dict[tuple, list[float]] = {job: [] for job in jobs}
                order = list(jobs)
                for index in range(rounds):
                    shift = index % len(order)
                    for job in order[shift:] + order[:shift]:
                        times[job].append(per_call_seconds(jobs[job], calls))
                medians = {job: statistics.median(seconds) for job, seconds in times.items()}
                reference = order[0][0]
                for (name, pass_name), seconds in medians.items():
                    baseline = medians[reference, pass_name]
                    records.append(
                        {
                            "kind": kind,
                            "dim": dim,
                            "rows": rows,
                            "pass": pass_name,
                            "impl": name,
                            "us": 1e6 * seconds,
                            "reference": reference,
                            "ratio": seconds / baseline,
                        }
                    )
    return records


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def print_table(records: list[dict]) -> None:
    print(f"{'kind':<9} {'D':>6} {'pass':<13} {'implementation':<24} {'us/call':>8} {'x ref':>6}")
    for r in records:
        print(f"{r['kind']:<9} {r['dim']:>6} {r['pass']:<13} {r['impl']:<24} {r['us']:>8.1f} {r['ratio']:>6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 768, 4096, 16384])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300, help="calls per contender per round")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: least noise)")
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    meta = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(["python", "scripts/bench_fused_host.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    print(f"{meta['cpu']}, {meta['cores']} cores, {args.threads} torch thread(s); torch {meta['torch']}")
    records = measure(args.dims, args.rows, args.rounds, args.calls)
    print_table(records)
    fused = [r for r in records if r["impl"] != r["reference"]]
    for pass_name in PASSES:
        worst = max(r["ratio"] for r in fused if r["pass"] == pass_name)
        print(f"{pass_name}: the fused call's host cost is at most {worst:.2f}x its reference's")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
