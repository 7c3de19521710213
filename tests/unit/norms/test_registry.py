"""norms/registry.py: names resolve to classes and backends, each imported only when first asked for."""

import subprocess
import sys

import pytest

import norms
from norms import NORM_NAMES, build_norm, norm_class

PROBE = """
import sys, norms
before = {m for m in sys.modules if m.startswith("norms.")}
norms.build_norm(NAME, 8)
after = {m for m in sys.modules if m.startswith("norms.")}
print(sorted(before)); print(sorted(after - before))
"""


def _imports(name: str) -> tuple[list[str], list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.replace("NAME", repr(name))], capture_output=True, text=True, check=True
    )
    before, added = (eval(line) for line in out.stdout.splitlines())
    return before, added


def test_importing_the_library_loads_no_norm_class_and_no_backend():
    before, added = _imports("rmsnorm")
    assert not any(m.startswith(("norms.fused", "norms.cpu", "norms.rmsnorm")) for m in before)
    # building an RMSNorm loads its class and its C kernel, and neither the Triton kernel nor DyT's
    assert "norms.rmsnorm" in added and "norms.cpu.rms_norm" in added
    assert not any(m.startswith(("norms.fused", "norms.cpu.pointwise", "norms.dynamic")) for m in added)


def test_the_fused_norm_loads_triton_when_built():
    _, added = _imports("fused_rmsnorm")
    assert "norms.fused.ops" in added


@pytest.mark.parametrize("name", NORM_NAMES)
def test_every_name_builds_its_class_and_the_functions_keep_their_names(name):
    assert type(build_norm(name, 8)) is norm_class(name)
    # a module file named like an exported function would replace it once imported: they never clash
    assert callable(norms.rms_norm) and callable(norms.layer_norm) and callable(norms.l2_norm)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="known norms: layernorm, rmsnorm"):
        norm_class("batchnorm")
