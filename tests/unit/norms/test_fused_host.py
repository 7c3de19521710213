"""scripts/bench_fused_host.py: its measurement, in a tiny mode, has the shape the docs' table is read from.

Speed is not asserted here (a ratio of host costs on a shared CI machine says nothing reliable); the
numbers and the command that gave them are in docs/fused_rmsnorm.md.
"""

import json
import math

import bench_fused_host
import torch

from norms.fused import kernels


def test_a_tiny_measurement_has_every_pass_implementation_and_ratio():
    records = bench_fused_host.measure([64], rounds=2, calls=3)
    assert {(r["kind"], r["pass"]) for r in records} == {
        (kind, pass_name) for kind in bench_fused_host.KINDS for pass_name in bench_fused_host.PASSES
    }
    for kind in bench_fused_host.KINDS:
        mine = [r for r in records if r["kind"] == kind]
        assert len({r["impl"] for r in mine}) == 2 and len({r["reference"] for r in mine}) == 1
        for r in mine:
            assert r["us"] > 0 and math.isfinite(r["ratio"]) and r["dim"] == 64 and r["rows"] == 1
            if r["impl"] == r["reference"]:
                assert r["ratio"] == 1.0


def test_the_launches_are_stubbed_only_while_measuring_and_outputs_are_still_allocated():
    real = kernels.rms_norm_fwd_kernel
    with bench_fused_host.stubbed_launches():
        assert kernels.rms_norm_fwd_kernel is not real
        x = torch.randn(2, 8, requires_grad=True)
        y = bench_fused_host.fused_rms_norm(x, torch.ones(8))
        y.backward(torch.ones_like(y))  # the backward's allocations and stubbed launches run too
        assert y.shape == x.shape and x.grad.shape == x.shape
    assert kernels.rms_norm_fwd_kernel is real
    expected = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(bench_fused_host.fused_rms_norm(x, torch.ones(8)), expected)


def test_the_script_prints_the_worst_ratio_of_each_pass_and_writes_json(tmp_path, capsys):
    out, threads = tmp_path / "host.json", torch.get_num_threads()
    try:
        assert bench_fused_host.main(["--dims", "64", "--rounds", "1", "--calls", "2", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the script runs on one thread; the tests after this one keep theirs
    printed = capsys.readouterr().out
    assert all(
        f"{pass_name}: the fused call's host cost is at most" in printed for pass_name in bench_fused_host.PASSES
    )
    data = json.loads(out.read_text())
    assert data["meta"]["cpu"] and data["meta"]["command"].startswith("python scripts/bench_fused_host.py")
    assert len(data["records"]) == 2 * len(bench_fused_host.PASSES) * len(bench_fused_host.KINDS)
