"""Forward, backward and forward+backward speed of every norm implementation on this machine.

    python -m lab bench-norms                          # CPU or GPU, defaults per device
    python -m lab bench-norms --dims 1024 4096 --dtypes bfloat16 --out bench_out/norms

Each result is a time and an effective bandwidth: bytes moved / time, counting x, y, dy, dx and
the weight once each (forward: x, y; backward: x, dy, dx; plus the weight and its gradient).
Two times, because a kernel can be fast while its call is slow: the kernel time (on CUDA
``triton.testing.do_bench``: the device's work for one call, the L2 cache flushed before each)
and the call time (``calls`` calls back to back, synchronized once at each end: what an eager
training loop pays, host included). On CPU the kernel time is perf_counter around each call.
A plain device copy (read x, write y) measured in the same run is the bandwidth ceiling, and
every result is also printed as a fraction of it: for forward+backward, the fraction of the
memory-bound floor of five tensor passes at copy bandwidth. Implementations are measured in
interleaved rounds (the order rotating), and each number is the median over rounds. Rows are sized so each tensor is far larger
than the caches. Every registered norm is timed as the model runs it (eager, and under
``torch.compile``), next to torch's own norms; a norm whose backend here is the Triton
interpreter (it would time Python, not the kernel) and Liger (needs CUDA and liger-kernel) are
listed as skipped, with the reason. Each runs on the backend the model would use (its
``backend(device)``: the C kernel for RMSNorm on CPU, torch's kernel for LayerNorm, ...).
``identity`` moves no memory: its time is the call overhead.

Output: a table on stdout, results.json and bandwidth.png in --out.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from lab.plots import pyplot, save
from norms import NORM_NAMES, build_norm

PASSES = ("fwd", "bwd", "fwd+bwd")


def measure(
    fn: Callable, device: torch.device, reps: int = 20, warmup: int = 3, setup: Callable | None = None
) -> float:
    """Median seconds of ``fn(setup())`` (or ``fn()``) after warm-up; ``setup`` runs untimed.

    CUDA events time the GPU work on GPU; perf_counter elsewhere.
    """
    times = []
    for rep in range(warmup + reps):
        args = (setup(),) if setup else ()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            started = time.perf_counter()
            fn(*args)
            seconds = time.perf_counter() - started
        if rep >= warmup:
            times.append(seconds)
    return statistics.median(times)


def kernel_time(fn: Callable, device: torch.device, reps: int = 20) -> float:
    """Median seconds of the device's work for one ``fn()``. On CUDA ``triton.testing.do_bench``, which flushes the
    L2 cache before each call with a 256 MB memset queued ahead of it: the host's cost of a call hides behind that
    memset (about 80 us on an H100) unless it is longer. Elsewhere ``measure``."""
    if device.type != "cuda":
        return measure(fn, device, reps)
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=reps, return_mode="median") / 1000  # reps: milliseconds of timed calls


def call_time(fn: Callable, device: torch.device, calls: int = 20) -> float:
    """Seconds per call of ``calls`` calls back to back, synchronized once before and once after: what an eager
    loop pays for each, its host work included (a call whose host work outlasts its kernels is host-bound here)."""
    fn()  # warm
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / calls


def time_passes(fn: Callable, x: torch.Tensor, dy, device: torch.device, timer: Callable, count: int) -> dict:
    """Seconds of the forward (recording the graph, as in training) and of forward then backward, timed by
    ``timer(call, device, count)``; the backward is their difference (timing it alone would need its graph
    rebuilt untimed before each call, which neither timer can do)."""
    x = x.detach().requires_grad_()

    def forward():
        x.grad = None
        return fn(x)

    def forward_backward():
        torch.autograd.backward(forward(), dy)

    seconds = {"fwd": timer(forward, device, count), "fwd+bwd": timer(forward_backward, device, count)}
    seconds["bwd"] = max(seconds["fwd+bwd"] - seconds["fwd"], 1e-9)
    return {pass_name: seconds[pass_name] for pass_name in PASSES}


def _liger_rmsnorm(dim: int, k: int) -> torch.nn.Module:
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    return LigerRMSNorm(dim, eps=1e-6)


# name -> module builder (dim). Every registered norm with its default options, eager as the
# model runs it, and the same module under torch.compile ("compiled_"); then torch's own norms.
IMPLEMENTATIONS: dict[str, Callable[[int], torch.nn.Module]] = {
    **{name: functools.partial(build_norm, name) for name in NORM_NAMES},
    **{f"compiled_{name}": functools.partial(build_norm, name) for name in NORM_NAMES},
    "torch_rmsnorm": lambda dim: torch.nn.RMSNorm(dim, eps=1e-6),
    "torch_layernorm": lambda dim: torch.nn.LayerNorm(dim),
    "liger_rmsnorm": lambda dim: _liger_rmsnorm(dim, dim),
}


def unavailable(name: str, device: torch.device) -> str | None:
    """Why an implementation cannot run here, or None."""
    if name.startswith("liger_"):
        if device.type != "cuda":
            return "needs CUDA"
        if importlib.util.find_spec("liger_kernel") is None:
            return "liger-kernel is not installed (pip install liger-kernel)"
        return None
    backend = getattr(IMPLEMENTATIONS[name](8), "backend", lambda device: "pytorch")(device)
    if backend == "triton-interpreter":
        return "its backend here is triton-interpreter: it would time Python, not the kernel (needs CUDA)"
    return None


def build(name: str, dim: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    module = IMPLEMENTATIONS[name](dim).to(device, dtype)
    if not name.startswith("compiled_"):
        return module
    # Fresh compile caches: stale entries from earlier sizes would hit the recompile limit and
    # silently fall back to eager.
    torch._dynamo.reset()
    return torch.compile(module)


def bench_one(fn: Callable, x: torch.Tensor, dy, device: torch.device, reps: int) -> dict[str, float]:
    """Seconds of ``fn(x)`` forward, backward and both. ``fn`` may return several tensors (a norm given a residual
    returns the normalized sum and the sum), ``dy`` then a gradient for each."""
    x = x.detach().requires_grad_()

    def forward():
        with torch.no_grad():
            fn(x)

    def forward_with_graph():
        x.grad = None
        return fn(x)

    def forward_backward():
        x.grad = None
        torch.autograd.backward(fn(x), dy)

    return {
        "fwd": measure(forward, device, reps),
        "bwd": measure(lambda y: torch.autograd.backward(y, dy), device, reps, setup=forward_with_graph),
        "fwd+bwd": measure(forward_backward, device, reps),
    }


def bytes_moved(rows: int, dim: int, element: int) -> dict[str, int]:
    tensor, weight = rows * dim * element, dim * element
    return {"fwd": 2 * tensor + weight, "bwd": 3 * tensor + 2 * weight, "fwd+bwd": 5 * tensor + 3 * weight}


def bench_every_norm(
    dims, dtypes, device: torch.device, tensor_mb: int, reps: int, rounds: int, skip: tuple[str, ...] = ()
) -> tuple[list[dict], dict[str, str]]:
    """Every implementation at every size. Per size, the implementations (and the copy baseline)
    are measured in ``rounds`` interleaved rounds, in an order that rotates, and each result is
    the median over rounds: machine noise falls on all of them alike."""
    results, skipped = [], {}
    names = []
    for name in IMPLEMENTATIONS:
        reason = "left out with --skip" if name in skip else unavailable(name, device)
        if reason:
            skipped[name] = reason
        else:
            names.append(name)
    for dtype in dtypes:
        element = torch.empty((), dtype=dtype).element_size()
        for dim in dims:
            rows = max(1, tensor_mb * 2**20 // (dim * element))
            x = torch.randn(rows, dim, device=device, dtype=dtype)
            dy = torch.randn_like(x)
            out = torch.empty_like(x)
            modules = {name: build(name, dim, device, dtype) for name in names}
            timings: dict[str, list[dict[str, float]]] = {name: [] for name in ["copy", *names]}
            order = list(timings)
            for round_index in range(rounds):
                shift = round_index % len(order)
                for name in order[shift:] + order[:shift]:
                    if name == "copy":
                        timings[name].append({"copy": kernel_time(functools.partial(out.copy_, x), device, reps)})
                        continue
                    kernel = (
                        time_passes(modules[name], x, dy, device, kernel_time, reps)
                        if device.type == "cuda"
                        else bench_one(modules[name], x, dy, device, reps)  # the backward timed alone, on CPU
                    )
                    call = time_passes(modules[name], x, dy, device, call_time, reps)
                    timings[name].append({**kernel, **{f"call {p}": call[p] for p in PASSES}})
            copy_s = statistics.median(t["copy"] for t in timings.pop("copy"))
            copy_bw = 2 * x.numel() * element / copy_s
            base = {"dtype": str(dtype)[6:], "dim": dim, "rows": rows}
            results.append({"impl": "copy", **base, "pass": "copy", "ms": 1000 * copy_s, "gbps": copy_bw / 1e9})
            results[-1]["frac_of_copy"] = 1.0
            moved = bytes_moved(rows, dim, element)
            for name, per_round in timings.items():
                for pass_name in PASSES:
                    seconds = statistics.median(t[pass_name] for t in per_round)
                    call_seconds = statistics.median(t[f"call {pass_name}"] for t in per_round)
                    bandwidth = moved[pass_name] / seconds
                    results.append(
                        {
                            "impl": name,
                            **base,
                            "pass": pass_name,
                            "ms": 1000 * seconds,
                            "gbps": bandwidth / 1e9,
                            "frac_of_copy": bandwidth / copy_bw,
                            "call_ms": 1000 * call_seconds,
                            "call_gbps": moved[pass_name] / call_seconds / 1e9,
                        }
                    )
    return results, skipped


def print_table(results: list[dict]) -> None:
    """Kernel time (ms, GB/s, fraction of the copy's bandwidth) and call time (ms) of each result."""
    print(f"{'impl':<20} {'dtype':<9} {'dim':>6} {'pass':<8} {'ms':>9} {'GB/s':>8} {'of copy':>8} {'call ms':>9}")
    for r in results:
        call = f"{r['call_ms']:>9.3f}" if "call_ms" in r else ""
        print(
            f"{r['impl']:<20} {r['dtype']:<9} {r['dim']:>6} {r['pass']:<8} {r['ms']:>9.3f} {r['gbps']:>8.1f} "
            f"{r['frac_of_copy']:>7.0%} {call}"
        )


def plot(results: list[dict], path: Path) -> None:
    plt = pyplot()
    dtypes = sorted({r["dtype"] for r in results})
    fig, axes = plt.subplots(len(dtypes), len(PASSES), figsize=(5 * len(PASSES), 3.5 * len(dtypes)), squeeze=False)
    for row, dtype in enumerate(dtypes):
        for col, pass_name in enumerate(PASSES):
            ax = axes[row][col]
            for impl in sorted({r["impl"] for r in results if r["pass"] == pass_name}):
                points = [
                    (r["dim"], r["frac_of_copy"])
                    for r in results
                    if r["impl"] == impl and r["dtype"] == dtype and r["pass"] == pass_name
                ]
                if points:
                    ax.plot(*zip(*sorted(points), strict=True), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{pass_name}, {dtype}")
            ax.set_xlabel("hidden size D")
            ax.set_ylabel("bandwidth / copy bandwidth")
            ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    save(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dims",
        type=int,
        nargs="+",
        default=None,
        help="default: 512 ... 65536 (powers of two) on GPU; 512, 2048, 8192, 32768 on CPU",
    )
    parser.add_argument("--dtypes", nargs="+", default=None, help="default: bfloat16 float32 on GPU, float32 on CPU")
    parser.add_argument("--tensor-mb", type=int, default=None, help="size of x (default 512 MB on GPU, 64 MB on CPU)")
    parser.add_argument(
        "--reps", type=int, default=None, help="timed calls per round (median); on CUDA, milliseconds of do_bench"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median over rounds)")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=list(IMPLEMENTATIONS), help="implementations to leave out"
    )
    parser.add_argument("--out", type=Path, default=Path("bench_out/norms"))


def run(args: argparse.Namespace) -> int:

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    dims = args.dims or ([2**i for i in range(9, 17)] if gpu else [512, 2048, 8192, 32768])
    dtypes = [getattr(torch, name) for name in (args.dtypes or (["bfloat16", "float32"] if gpu else ["float32"]))]
    tensor_mb = args.tensor_mb or (512 if gpu else 64)
    reps = args.reps or (20 if gpu else 3)

    name = torch.cuda.get_device_name(device) if gpu else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device: {name}; torch {torch.__version__}; x is {tensor_mb} MB per run")
    results, skipped = bench_every_norm(dims, dtypes, device, tensor_mb, reps, args.rounds, tuple(args.skip))
    print_table(results)
    for impl, reason in skipped.items():
        print(f"skipped {impl}: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": name, "torch": torch.__version__, "tensor_mb": tensor_mb, "reps": reps, "rounds": args.rounds}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results, "skipped": skipped}, indent=1))
    plot(results, args.out / "bandwidth.png")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'bandwidth.png'}")
    return 0
