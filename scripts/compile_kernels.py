"""Compile the fused RMSNorm's kernels for real NVIDIA GPUs on any machine, and check what the compiler made of them.

    python scripts/compile_kernels.py                  # sm_80 and sm_90
    python scripts/compile_kernels.py --targets 90 --jobs 2

The interpreter that runs the kernels on CPU says nothing about what a GPU would run, so every
launch configuration the launcher can pick (norms/fused/launch.py's table) is compiled with
``triton.compile`` for a ``GPUTarget``, through the ``ptxas`` inside the triton wheel (no GPU
needed), **with the arguments the launcher really passes**: ``norms.fused.ops`` builds the
launch on meta tensors of a training batch (16,384 rows; bf16 tensors, whose pointers a real
launch finds 16-byte aligned, and D = 768, 4,096, ... whose strides are divisible by 16), and
Triton's own launch-time specializer turns those arguments into the divisibility hints a real
launch compiles with. Without the hints every access is scalar and the register counts differ.

Checked for each compiled kernel, from its PTX (each global access traced to the tensor it
reads or writes, through the registers that compute its address back to a kernel parameter)
and, for the backward, its SASS, read once per loop shape and target (``LOOP_SHAPE``: the first
case that has it, the register-heaviest flags; a disassembly costs 0.4 s, most of the check's time):

- no spills (``cuobjdump -res-usage`` of the cubin Triton built: no stack, no local memory);
- x, y, dx and dy (and the residual, the sum and its gradient) move in 128-bit accesses
  (ld/st.global.v4, cp.async of 16 bytes) wherever D is a multiple of 16;
- the backward's row loop prefetches with cp.async (LDGSTS) when the table pipelines it, and
  has at most two barriers (BAR.SYNC) an iteration;
- the backward's persistent grid is one wave: the compiled kernel (its registers, shared memory
  and warps) fits at least one program per SM of the target (A100 for sm_80, H100 for sm_90),
  and the launcher's grid is that many programs times the SMs.

Coverage, factorized so that the check runs in about 16 s on two cores: (a) every block size
of the table in float32 and bfloat16, and the looping path past it, with the register-heaviest
flags (the residual, the 1 + w gain in float32, a partial statistic, HF's cast order); float16,
which shares bfloat16's table, at D = 768, 16,384 and 32,768; (b) an all-pairs cover of the flags
(residual, gain, cast order, partial, weight dtype: every pair of two flags' values at least
once, 8 combinations) in bfloat16 at the shapes training uses most (QK-norm's 128, D = 768,
4,096, the widest single block 16,384) and on the looping path; (c) odd sizes (D = 1000, 123)
that get no divisibility hints, to compile without spills (not to vectorize). A launch whose
specialization another case already compiled is compiled once. Exits 1 on a compile error or a
failed check.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

from norms.fused import ops
from norms.fused.launch import H100_SXM, SINGLE_BLOCK_BYTES, SMLimits, programs_per_sm, row_settings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TARGETS = {80: SMLimits(sms=108, shared_bytes=164 * 1024), 90: H100_SXM}  # A100 and H100 SXM
ROWS = 16384  # a training batch's rows (gpu_125m's is 32 x 1024): what M looks like at run time
# Tensors every access of which must be 128 bits wide where D is a multiple of 16.
STREAMED = {"x", "y", "dy", "dx", "r", "s", "ds"}
POINTER_NAMES = {"X": "x", "Y": "y", "DY": "dy", "DX": "dx", "R": "r", "S": "s", "DS": "ds", "W": "w", "RSTD": "rstd",
                 "DW_PARTIAL": "partial", "PARTIAL": "partial", "DW": "dw", "DOT": "dot"}  # fmt: skip
# (The kernels take their pointers first: the PTX's first parameters, in order, are the pointers.)
# The launch constants that schedule a backward's loop. The variant's flags (GAIN, HAS_DRESIDUAL, PARTIAL) add work
# inside the same loop, which every kernel's PTX is checked for; its SASS is read once per shape and target.
LOOP_SHAPE = ("BLOCK", "HALF", "NUM_STAGES", "ROWS", "num_warps")


@dataclass(frozen=True)
class Case:
    """One call of the fused norm the launcher may see: input dtype, D, and the variant's flags."""

    dtype: str
    dim: int
    weight: str  # the gain's dtype, or "none"
    residual: bool
    gain: int  # 0: w, 1: 1 + w, 2: none
    cast_before_weight: bool
    partial: bool

    @property
    def label(self) -> str:
        flags = f"res={int(self.residual)} gain={self.gain} cast={int(self.cast_before_weight)} k<D={int(self.partial)}"
        return f"{self.dtype} D={self.dim} w={self.weight} {flags}"


def _heaviest(dtype: str, dim: int) -> Case:
    return Case(dtype, dim, "float32", True, 1, True, dim > 1)


def _single_block_sizes(dtype: str) -> list[int]:
    widest = SINGLE_BLOCK_BYTES // DTYPES[dtype].itemsize
    return [2**i for i in range(widest.bit_length())]


def flag_pairs() -> list[tuple]:
    """(residual, gain, cast_before_weight, partial, weight) combinations in which every pair of two flags'
    values occurs at least once (a greedy all-pairs cover of the full product's 40 combinations)."""
    combos = [
        (residual, gain, cast, partial, weight)
        for residual, gain, cast, partial in itertools.product((False, True), (0, 1, 2), (False, True), (False, True))
        for weight in (("none",) if gain == 2 else ("bfloat16", "float32"))
    ]

    def pairs(combo):
        return set(itertools.combinations(enumerate(combo), 2))

    uncovered, chosen = set().union(*map(pairs, combos)), []
    while uncovered:
        best = max(combos, key=lambda combo: len(pairs(combo) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def cases() -> list[Case]:
    """The factorized set described in the module docstring, without duplicates."""
    found = []
    for dtype in ("float32", "bfloat16"):  # (a) every block size, D = 768, and the looping path
        sizes = _single_block_sizes(dtype)
        found += [_heaviest(dtype, dim) for dim in [*sizes, 768, 2 * sizes[-1]]]
    found += [_heaviest("float16", dim) for dim in (768, 16384, 32768)]  # float16: bfloat16's table
    for dim, flags in itertools.product((128, 768, 4096, 16384, 32768), flag_pairs()):  # (b) the flags
        residual, gain, cast, partial, weight = flags
        found.append(Case("bfloat16", dim, weight, residual, gain, cast, partial))
    found += [_heaviest("bfloat16", 1000), _heaviest("float32", 123)]  # (c) no divisibility hints
    return list(dict.fromkeys(found))


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")  # data_ptr() 0: aligned, as a fresh allocation is


class _Recorder:
    """A launcher (``wrap``) for ops' _forward/_backward that records each launch instead of running it."""

    def __init__(self):
        self.launches: list[tuple] = []

    def __call__(self, kernel):
        recorder = self

        class _Grid:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: recorder.launches.append((kernel, grid, args, kwargs))

        return _Grid()


def launches(case: Case) -> list[tuple]:
    """(kernel, grid, args, kwargs) of every launch one forward and backward of ``case`` makes, built by
    norms.fused.ops itself on meta tensors."""
    dtype, dim = DTYPES[case.dtype], case.dim
    x, residual = _meta((ROWS, dim), dtype), _meta((ROWS, dim), dtype) if case.residual else None
    weight = None if case.weight == "none" else _meta(dim, DTYPES[case.weight])
    k = max(1, dim // 16) if case.partial else dim  # pRMSNorm's 6.25%
    record = _Recorder()
    _, total, rstd, launch = ops._forward(x, residual, weight, k, 1e-6, case.cast_before_weight, case.gain, record)
    dsum = total if case.residual else None
    ops._backward(launch, x, dsum, x if total is None else total, weight, rstd, k, record)
    return record.launches


def compile_launch(kernel, args, kwargs, arch: int):
    """Compile as a launch with these arguments would: Triton's launch-time specializer (the one
    ``kernel[grid](...)`` runs) gives the signature, constants and divisibility attributes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constants, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constants, attrs), target=target, options=options.__dict__)


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, spilled bytes: local memory and stack) of the cubin Triton built, from ``cuobjdump -res-usage``."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    fields = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    return int(fields["REG"]), int(fields["STACK"]) + int(fields["LOCAL"])


_ACCESS = re.compile(r"\b(ld\.global|st\.global|cp\.async\.c[ag]\.shared\.global)(\S*)\s+[^;]*;")
_INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+([^;]*);")
_PARAM = re.compile(r"\[(\w+)_param_(\d+)\]")


def _definitions(lines: list[str]) -> dict[str, set[str]]:
    """For each 64-bit register of the PTX, what its definitions read: other 64-bit registers, or a kernel
    parameter (``param:N``). PTX reuses registers across a loop's iterations, so a register may have several."""
    sources: dict[str, set[str]] = {}
    for line in lines:
        match = _INSTRUCTION.match(line)
        if not match or match.group(1).startswith(("st.", "cp.async", "bra", "bar")):
            continue
        operands = [o.strip() for o in match.group(2).split(",")]
        if not operands or not operands[0].startswith("%rd"):
            continue
        param = _PARAM.search(match.group(2))
        reads = {f"param:{param.group(2)}"} if param else set(re.findall(r"%rd\d+", ",".join(operands[1:])))
        sources.setdefault(operands[0], set()).update(reads)
    return sources


def _parameters_of(register: str, sources: dict[str, set[str]]) -> set[int]:
    """The kernel parameters an address register is computed from (following 64-bit registers only: the
    32-bit offsets and strides that scale into it are not pointers)."""
    seen, stack, params = set(), [register], set()
    while stack:
        reg = stack.pop()
        for source in sources.get(reg, ()):
            if source.startswith("param:"):
                params.add(int(source[6:]))
            elif source not in seen:
                seen.add(source)
                stack.append(source)
    return params


def _access_bits(op: str, suffix: str, text: str) -> int:
    if op.startswith("cp.async"):
        return 8 * int(re.search(r",\s*(0x[0-9a-f]+|\d+)\s*(?:,|;)", text).group(1), 0)
    vector = re.search(r"\.v(\d)", suffix)
    width = re.search(r"\.[bfsu](\d+)$", suffix)
    return (int(vector.group(1)) if vector else 1) * int(width.group(1))


def _loops(lines: list[str], label: re.Pattern, branch: re.Pattern) -> list[tuple[int, int]]:
    """(first, last) line of each loop body: a branch back to a label defined before it."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := label.match(line))}
    return [
        (labels[m.group(1)], i)
        for i, line in enumerate(lines)
        if (m := branch.search(line)) and m.group(1) in labels and labels[m.group(1)] < i
    ]


def analyse_ptx(ptx: str, pointers: list[str]) -> dict:
    """Each global access as (tensor, bits), the tensor found by tracing its address back to the kernel
    parameter it is computed from (``pointers``: the tensor of each parameter, in order; "?" where several or
    none); and the main loop's barriers and cp.async count (the main loop: the longest)."""
    lines = ptx.splitlines()
    loops = _loops(lines, re.compile(r"^(\$L__BB\d+_\d+):"), re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);"))
    main = max(loops, key=lambda span: span[1] - span[0], default=(-1, -1))
    sources = _definitions(lines)
    accesses = []
    for line in lines:
        match = _ACCESS.search(line)
        if match:
            address = re.search(r"\[\s*(%rd\d+)", match.group(0))
            params = {p for p in _parameters_of(address.group(1), sources) if p < len(pointers)} if address else ()
            tensor = pointers[next(iter(params))] if len(params) == 1 else "?"
            bits = _access_bits(match.group(1), match.group(2), match.group(0))
            accesses.append((tensor, bits))
    body = lines[main[0] : main[1] + 1] if main[0] >= 0 else []
    return {
        "accesses": accesses,
        "loop_barriers": sum(bool(re.search(r"\b(bar|barrier)\.sync\b", line)) for line in body),
        "loop_cp_async": sum("cp.async.c" in line for line in body),
    }


def analyse_sass(sass: str) -> dict:
    """128-bit and 16-bit global accesses, and the main loop's BAR.SYNC and LDGSTS."""
    lines = sass.splitlines()
    loops = _loops(lines, re.compile(r"^\s*(\.?L\w+):\s*$"), re.compile(r"\bBRA\s+`?\(?(\.?L\w+)"))
    main = max(loops, key=lambda span: span[1] - span[0], default=(-1, -1))
    body = lines[main[0] : main[1] + 1] if main[0] >= 0 else []
    return {
        "wide": sum(bool(re.search(r"\b(LDG|STG|LDGSTS)\.E[.\w]*\.128\b", line)) for line in lines),
        "narrow": sum(bool(re.search(r"\b(LDG|STG)\.E\.(U16|S16|16)\b", line)) for line in lines),
        "loop_barriers": sum("BAR.SYNC" in line for line in body),
        "loop_ldgsts": sum("LDGSTS" in line for line in body),
    }


def _kernel_name(kernel) -> str:
    return kernel.fn.__name__.removesuffix("_kernel")


def check(case: Case, kernel, grid, args, kwargs, arch: int, read_sass: bool) -> dict:
    """Compile one launch for sm_<arch> and check it (its SASS too where ``read_sass``, for a backward); the
    result names errors instead of raising."""
    name = _kernel_name(kernel)
    result = {"case": case.label, "kernel": name, "sm": arch, "warps": kwargs.get("num_warps"), "failures": []}
    result["stages"] = kwargs.get("NUM_STAGES")
    try:
        compiled = compile_launch(kernel, args, kwargs, arch)
        registers, spills = resource_usage(compiled.asm["cubin"])
    except Exception as err:  # a compile error is a result to report, not a crash
        result["failures"].append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        return result
    pointers = [POINTER_NAMES.get(arg, arg) for arg, kind in compiled.src.signature.items() if kind.startswith("*")]
    ptx = analyse_ptx(compiled.asm["ptx"], pointers)
    # The SASS (0.4 s to disassemble) is read where the PTX cannot tell: the backward's loop as scheduled.
    sass = analyse_sass(compiled.asm["sass"]) if read_sass and name.startswith("rms_norm_bwd") else None
    shared = compiled.metadata.shared
    per_sm = programs_per_sm(registers, shared, compiled.metadata.num_warps, TARGETS[arch])
    widths: dict[str, set[int]] = {}
    for tensor, bits in ptx["accesses"]:
        widths.setdefault(tensor, set()).add(bits)
    result.update(registers=registers, spill_bytes=spills, shared=shared, programs_per_sm=per_sm, widths=widths)
    if sass:
        result.update(loop_barriers=sass["loop_barriers"], loop_ldgsts=sass["loop_ldgsts"])
    failures = result["failures"]
    if spills:
        failures.append(f"{spills} bytes spilled")
    if per_sm < 1:
        failures.append(f"no program fits an SM ({shared} B shared, {registers} registers)")
    hinted = case.dim % 16 == 0  # D, and so the row strides, divisible by 16: the launcher's hints
    if hinted and name.startswith("rms_norm"):
        narrow = {t: sorted(b) for t, b in widths.items() if t in STREAMED and b != {128}}
        if narrow:
            failures.append(f"accesses narrower than 128 bits: {narrow}")
        if sass and (sass["narrow"] or not sass["wide"]):
            failures.append(f"SASS: {sass['wide']} 128-bit and {sass['narrow']} 16-bit global accesses")
    if name in ("rms_norm_bwd", "rms_norm_bwd_wide") and hinted:
        if kwargs.get("NUM_STAGES", 1) > 1 and not (ptx["loop_cp_async"] and (sass is None or sass["loop_ldgsts"])):
            failures.append("no cp.async (LDGSTS) in the pipelined row loop")
        barriers = max(ptx["loop_barriers"], sass["loop_barriers"] if sass else 0)
        if barriers > 2:
            failures.append(f"{barriers} barriers an iteration of the row loop")
    if name.startswith("rms_norm_bwd"):  # the launcher's grid for a batch of ROWS rows, at this GPU's wave
        tiles = -(-ROWS // row_settings(case.dim, DTYPES[case.dtype].itemsize).backward.rows)
        result["grid"] = min(per_sm * TARGETS[arch].sms, tiles)
    return result


def _signature_key(kernel, args, kwargs) -> tuple:
    """What decides the compiled code: the kernel, its arguments' specialization and the constants."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    spec = tuple(native_specialize_impl(CUDABackend, a, False, True, True) if a is not None else None for a in args)
    return (kernel.fn.__name__, spec, tuple(sorted(kwargs.items())))


def _loop_shape(case: Case, kernel, kwargs) -> tuple:
    shape = tuple(kwargs.get(name) for name in LOOP_SHAPE)
    return (kernel.fn.__name__, case.dtype, case.dim % 16 == 0, shape)


def work(targets: list[int]) -> list[tuple[Case, int, int, bool]]:
    """(case, which of its launches, arch, whether to read its SASS) for every distinct compiled kernel: a launch
    shared by several cases (the weight gradient's sum, say) is compiled once, under the first case that makes it;
    the SASS is read under the first case of each loop shape."""
    seen, shapes, found = set(), set(), []
    for case in cases():
        for index, (kernel, _, args, kwargs) in enumerate(launches(case)):
            key = _signature_key(kernel, args, kwargs)
            if key not in seen:
                seen.add(key)
                shape = _loop_shape(case, kernel, kwargs)
                found += [(case, index, arch, shape not in shapes) for arch in targets]
                shapes.add(shape)
    return found


def _check_one(item: tuple[Case, int, int, bool]) -> dict:
    case, index, arch, read_sass = item
    return check(case, *launches(case)[index], arch, read_sass)


def compile_all(targets: list[int], jobs: int) -> list[dict]:
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_check_one, work(targets), chunksize=4))


def _widths(widths: dict) -> str:
    return " ".join(f"{t}:{'/'.join(map(str, sorted(b)))}" for t, b in sorted(widths.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[80, 90], choices=sorted(TARGETS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    results = compile_all(args.targets, args.jobs)
    header = f"{'kernel':<22} {'case':<62} {'sm':>3} {'warps':>5} {'st':>2} {'regs':>4} {'spill':>5} {'smem':>6}"
    print(f"{header} {'/SM':>3} {'bar':>3} {'ldgsts':>6}  access bits")
    for r in results:
        if "registers" not in r:
            continue
        print(
            f"{r['kernel']:<22} {r['case']:<62} {r['sm']:>3} {r['warps']:>5} {r['stages'] or '':>2} "
            f"{r['registers']:>4} {r['spill_bytes']:>5} {r['shared']:>6} {r['programs_per_sm']:>3} "
            f"{r.get('loop_barriers', ''):>3} {r.get('loop_ldgsts', ''):>6}  {_widths(r['widths'])}"
        )
    failed = [r for r in results if r["failures"]]
    for r in failed:
        print(f"FAILED sm_{r['sm']} {r['kernel']} {r['case']}: {'; '.join(r['failures'])}")
    compiled = [r for r in results if "registers" in r]
    most = max(compiled, key=lambda r: r["registers"])
    print(
        f"{len(results)} kernels compiled for sm_{', sm_'.join(map(str, args.targets))}: {len(failed)} failed; "
        f"most registers {most['registers']} ({most['kernel']} {most['case']}, sm_{most['sm']})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
