"""The fused kernels compiled for real GPUs (sm_80, sm_90) on this CPU-only machine, with the launcher's own
arguments: no spills, 128-bit accesses, cp.async and at most two barriers in the backward's loop, one wave."""

import os
import re
import subprocess
import sys

import compile_kernels
import pytest
from tiny_runs import ROOT

from norms.fused.launch import row_settings

triton = pytest.importorskip("triton")


def test_every_launch_configuration_is_in_the_compiled_set():
    """Every row of the table (it depends on the element size: float16 and bfloat16 share theirs)."""

    def shapes(dtype, dim):
        size = compile_kernels.DTYPES[dtype].itemsize
        settings = row_settings(dim, size)
        return size, settings.forward, settings.backward

    compiled = {shapes(case.dtype, case.dim) for case in compile_kernels.cases()}
    picked = {shapes(dtype, dim) for dtype in compile_kernels.DTYPES for dim in range(1, 3 * 16384)}
    assert picked <= compiled


def test_the_flag_combinations_cover_every_pair_of_values():
    chosen = compile_kernels.flag_pairs()
    values = [{combo[i] for combo in chosen} for i in range(5)]
    assert values[:4] == [{False, True}, {0, 1, 2}, {False, True}, {False, True}]
    assert values[4] == {"bfloat16", "float32", "none"}
    assert all(
        any(combo[1] == gain and combo[3] == partial for combo in chosen) for gain in (0, 1, 2) for partial in (0, 1)
    )


def test_the_launch_is_built_by_the_launcher_with_its_run_time_hints():
    """What is compiled is what ops passes: a bf16 launch at D = 768 on 16,384 rows gets 16-divisible pointers,
    strides and sizes, which is what makes its accesses 128 bits wide."""
    case = compile_kernels.Case("bfloat16", 768, "float32", True, 0, False, False)
    forward, backward, weight_sum = compile_kernels.launches(case)
    assert [compile_kernels._kernel_name(launch[0]) for launch in (forward, backward, weight_sum)] == [
        "rms_norm_fwd",
        "rms_norm_bwd",
        "sum_partials",
    ]
    kernel, grid, args, kwargs = forward
    assert grid == (16384 // row_settings(768, 2).forward.rows,) and args[6:13] == (768, 768, 768, 768, 16384, 768, 768)
    binder_key = compile_kernels._signature_key(kernel, args, kwargs)[1]
    assert binder_key[0] == ("*bf16", "D") and binder_key[6] == ("i32", "D")  # aligned x, 16-divisible stride


def test_every_specialization_compiles_and_passes_the_checks_for_sm80_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    result = subprocess.run(
        [sys.executable, "scripts/compile_kernels.py", "--targets", "80", "90"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "TRITON_DEFAULT_FP_FUSION": "1"},
    )
    summary = result.stdout.strip().splitlines()[-1]
    print(summary)  # registers, spills, access widths and barriers per kernel are in the script's table
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    compiled = int(re.match(r"(\d+) kernels compiled for sm_80, sm_90: 0 failed", summary).group(1))
    assert compiled == len(compile_kernels.work([80, 90]))
    table = result.stdout
    # The backward's pipelined loop at D = 768: cp.async in it, two barriers, 128-bit x, dy and dx.
    row = re.search(r"^rms_norm_bwd +bfloat16 D=768 .* 90 .*$", table, re.MULTILINE).group()
    assert " x:128" in row and " dy:128" in row and " dx:128" in row
