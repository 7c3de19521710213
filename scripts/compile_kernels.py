"""Compile the fused RMSNorm's Triton kernels for real NVIDIA GPUs, on any machine, and report registers and spills.

    python scripts/compile_kernels.py                  # sm_80 and sm_90
    python scripts/compile_kernels.py --targets 90 --jobs 2

The interpreter that runs the kernels on CPU accepts programs the real compiler rejects or
spills, so every specialization that ``norms.fused.ops.launch_config`` can pick is compiled
with ``triton.compile`` for a ``GPUTarget`` through the ``ptxas`` inside the triton wheel (no
GPU needed), and ``ptxas -v`` reports its registers and spill bytes. Coverage, factorized so it
runs in about a minute: (a) every block size and row tile the launcher picks (rows of 1 to
8192 features, and the looping path past that), in float32, bfloat16 and float16, forward
and backward, with the register-heaviest flags; (b) every combination of flags (residual,
gain, cast order, weight dtype) for every dtype at the largest single block and on the
looping path. Exits 1 on a compile error or a spill.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from norms.fused import kernels
from norms.fused.ops import MAX_SINGLE_BLOCK, launch_config

DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
ROW_SIZES = [2**i for i in range(14)] + [MAX_SINGLE_BLOCK + 1]  # every block size, then the looping path


@dataclass(frozen=True)
class Specialization:
    kernel: str  # "fwd" or "bwd"
    dtype: str
    weight: str  # the gain's dtype, or "none"
    residual: bool
    gain: int
    cast_before_weight: bool
    dim: int
    constants: dict = field(hash=False, compare=False)

    @property
    def label(self) -> str:
        block, rows, single, _ = launch_config(self.dim)
        path = f"block {block} x {rows} rows" if single else f"looping, block {block}"
        flags = f"res={int(self.residual)} gain={self.gain} cast={int(self.cast_before_weight)} w={self.weight}"
        return f"{self.kernel} {self.dtype} {path} {flags}"


def _specialization(kernel, dtype, weight, residual, gain, cast, dim) -> Specialization:
    block, rows, single, _ = launch_config(dim)
    constants = {"GAIN": gain, "BLOCK": block, "ROWS": rows, "SINGLE_BLOCK": single}
    if kernel == "fwd":
        constants.update(HAS_RESIDUAL=residual, CAST_BEFORE_WEIGHT=cast)
    else:
        constants.update(HAS_DRESIDUAL=residual)
    return Specialization(kernel, dtype, weight, residual, gain, cast, dim, constants)


def specializations() -> list[Specialization]:
    """The factorized set described in the module docstring, without duplicates."""
    found = []
    for kernel, dtype, dim in itertools.product(("fwd", "bwd"), DTYPES, ROW_SIZES):
        found.append(_specialization(kernel, dtype, "fp32", True, 1, kernel == "fwd", dim))
    for kernel, dtype, dim in itertools.product(("fwd", "bwd"), DTYPES, (MAX_SINGLE_BLOCK, MAX_SINGLE_BLOCK + 1)):
        for gain, residual in itertools.product((0, 1, 2), (False, True)):
            weights = ["none"] if gain == 2 else sorted({"fp32", DTYPES[dtype]})
            casts = (False, True) if kernel == "fwd" else (False,)
            for weight, cast in itertools.product(weights, casts):
                found.append(_specialization(kernel, dtype, weight, residual, gain, cast, dim))
    return list(dict.fromkeys(found))


def _signature(spec: Specialization) -> dict[str, str]:
    x = "*" + DTYPES[spec.dtype]
    w = x if spec.weight == "none" else "*" + spec.weight
    if spec.kernel == "fwd":
        pointers = {"X": x, "R": x, "W": w, "Y": x, "S": x, "RSTD": "*fp32"}
        ints = ["stride_x", "stride_r", "stride_y", "stride_s", "M", "N", "K"]
        return {**pointers, **dict.fromkeys(ints, "i32"), "eps": "fp32"}
    pointers = {"DY": x, "X": x, "W": w, "RSTD": "*fp32", "DS": x, "DX": x, "DW_PARTIAL": "*fp32", "DOT": "*fp32"}
    ints = ["stride_dy", "stride_x", "stride_ds", "stride_dx", "M", "N", "K", "rows_per_program"]
    return {**pointers, **dict.fromkeys(ints, "i32")}


def _ptxas_report(ptx: str, arch: int) -> tuple[int, int]:
    """(registers, spill bytes) from ``ptxas -v`` on the kernel's PTX."""
    from triton.backends.nvidia.compiler import get_ptxas

    gpu = re.search(r"\.target\s+(sm_\w+)", ptx).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        result = subprocess.run(
            [get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", source, "-o", os.path.join(tmp, "kernel.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    registers = int(re.search(r"Used (\d+) registers", result.stderr).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", result.stderr))
    return registers, spills


def compile_one(spec: Specialization, arch: int) -> dict:
    """Compile one specialization for sm_<arch>; the result names errors instead of raising."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = kernels.rms_norm_fwd_kernel if spec.kernel == "fwd" else kernels.rms_norm_bwd_kernel
    warps = launch_config(spec.dim)[3]
    signature = {**_signature(spec), **dict.fromkeys(spec.constants, "constexpr")}
    started = time.perf_counter()
    try:
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs=spec.constants),
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": warps},
        )
        registers, spills = _ptxas_report(compiled.asm["ptx"], arch)
        error = None
    except Exception as err:  # a compile error is a result to report, not a crash
        registers, spills, error = -1, -1, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return {
        "kernel": spec.label,
        "sm": arch,
        "warps": warps,
        "registers": registers,
        "spill_bytes": spills,
        "seconds": time.perf_counter() - started,
        "error": error,
    }


def _compile_pair(args) -> dict:
    return compile_one(*args)


def compile_all(targets: list[int], jobs: int) -> list[dict]:
    work = [(spec, arch) for arch in targets for spec in specializations()]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_compile_pair, work, chunksize=8))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[80, 90], help="compute capabilities")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    results = compile_all(args.targets, args.jobs)
    print(f"{'kernel':<66} {'sm':>3} {'warps':>5} {'regs':>5} {'spill B':>7}")
    for r in results:
        print(f"{r['kernel']:<66} {r['sm']:>3} {r['warps']:>5} {r['registers']:>5} {r['spill_bytes']:>7}")
    failed = [r for r in results if r["error"] or r["spill_bytes"] > 0]
    for r in failed:
        print(f"FAILED sm_{r['sm']} {r['kernel']}: {r['error'] or str(r['spill_bytes']) + ' bytes spilled'}")
    most = max(results, key=lambda r: r["registers"])
    print(
        f"{len(results)} kernels compiled for sm_{', sm_'.join(map(str, args.targets))}: {len(failed)} failed; "
        f"most registers {most['registers']} ({most['kernel']}, sm_{most['sm']})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
