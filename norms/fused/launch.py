"""How the fused RMSNorm's kernels are launched: a table by row length, and the backward's one-wave grid.

One row of the table per block size (the row length D rounded up to a power of two), derived
from a few rules rather than searched, and checked for every entry by scripts/compile_kernels.py
(sm_80 and sm_90: no spills, 128-bit accesses, cp.async in the backward loop, at most two
barriers an iteration). docs/fused_rmsnorm.md gives the table and the reasons:

- A row of up to 32 KB (16,384 bf16/fp16 features, 8,192 fp32) is held whole, in one block.
  Longer rows loop over blocks of LOOPING_BLOCK features, reading each row twice.
- Forward: tiles of FWD_TILE elements (short rows share a program: QK-norm's 64-128 features
  get 32-64 rows), 16 elements a thread (two 128-bit vectors of bf16).
- Backward: tiles of BWD_TILE elements, 16 elements a thread (a thread holds x, dy, dx, the gain
  and the weight-gradient accumulator of its elements in registers), the row loop
  software-pipelined BWD_STAGES deep. A row of the widest block (32 KB) does not fit a thread's
  registers that way: its own kernel reads each row twice, in halves, the second time from L1.
- The backward's grid is persistent: as many programs as fit on the GPU at once (registers,
  shared memory and threads of the compiled kernel against the SM's), never more than tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SINGLE_BLOCK_BYTES = 32 * 1024
LOOPING_BLOCK = 4096
FWD_TILE, FWD_ELEMENTS_PER_THREAD = 4096, 16
BWD_TILE, BWD_ELEMENTS_PER_THREAD, BWD_STAGES = 2048, 16, 3
LOOPING_WARPS = 8
WIDE_WARPS = 32
MAX_WARPS = {"fwd": 16, "bwd": 16}
# The weight gradient's partial sums, one row per backward program: summed in tiles of
# SUM_ROWS programs x SUM_BLOCK features, a program per SUM_BLOCK features.
SUM_ROWS, SUM_BLOCK, SUM_WARPS = 64, 64, 4
# Programs the interpreter runs for the backward: it runs them one after another, so few is fastest.
INTERPRETER_PROGRAMS = 4


@dataclass(frozen=True)
class KernelShape:
    """One kernel's launch shape: which kernel ("tile", "wide" or "looping"), features per block, rows per tile,
    warps, and the row loop's pipeline stages."""

    kind: str
    block: int
    rows: int
    warps: int
    stages: int = 1


@dataclass(frozen=True)
class RowSettings:
    """Launch settings for rows of one block size and element size."""

    single_block: bool
    forward: KernelShape
    backward: KernelShape


def _warps(elements: int, per_thread: int, cap: int) -> int:
    return min(max(elements // (32 * per_thread), 1), cap)


def row_settings(dim: int, element_size: int) -> RowSettings:
    """The table's row for D = ``dim`` features of ``element_size`` bytes."""
    block = 1 << (dim - 1).bit_length()
    if block * element_size > SINGLE_BLOCK_BYTES:
        looping = KernelShape("looping", LOOPING_BLOCK, 1, LOOPING_WARPS)
        return RowSettings(False, looping, looping)
    fwd_rows = max(1, FWD_TILE // block)
    forward = KernelShape("tile", block, fwd_rows, _warps(fwd_rows * block, FWD_ELEMENTS_PER_THREAD, MAX_WARPS["fwd"]))
    bwd_warps = _warps(max(block, BWD_TILE), BWD_ELEMENTS_PER_THREAD, MAX_WARPS["bwd"])
    if block * element_size == SINGLE_BLOCK_BYTES:  # the widest: no registers left for a pipeline
        backward = KernelShape("wide", block, 1, WIDE_WARPS)
    else:
        backward = KernelShape("tile", block, max(1, BWD_TILE // block), bwd_warps, BWD_STAGES)
    return RowSettings(True, forward, backward)


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds at once, and how many there are."""

    sms: int
    registers: int = 65536
    shared_bytes: int = 228 * 1024
    threads: int = 2048
    programs: int = 32
    reserved_shared_per_program: int = 1024  # the driver's share of each block's shared memory (sm_80+)


H100_SXM = SMLimits(sms=132)  # the proxy's GPU: sm_90, 228 KB of shared memory per SM


def programs_per_sm(registers_per_thread: int, shared_bytes: int, warps: int, limits: SMLimits) -> int:
    """Programs of one kernel resident on an SM at once: the tightest of registers (allocated per warp in
    units of 256), shared memory, threads and the program cap. 0 when one program does not fit."""
    registers_per_warp = math.ceil(registers_per_thread * 32 / 256) * 256
    by_registers = limits.registers // registers_per_warp // warps
    by_shared = limits.shared_bytes // (shared_bytes + limits.reserved_shared_per_program)
    by_threads = limits.threads // (32 * warps)
    return min(by_registers, by_shared, by_threads, limits.programs)
