"""Under torch.compile the fused norm's kernels are visible to the compiler, not hidden in an opaque op.

torch.compile's AOT stage decomposes the triton_ops into their kernels (``triton_kernel_wrapper_functional``
nodes, which Inductor schedules and launches itself). Checked on CPU with the kernels compiled, not
interpreted (a subprocess without TRITON_INTERPRET), on fake CUDA tensors: nothing runs, the graph is
only traced. What this cannot check without a GPU: Inductor's code generation for those nodes, and its
analysis of which tensors each kernel writes (it compiles the kernel for the device to find out).
"""

import json
import os
import subprocess
import sys

from tiny_runs import ROOT

from norms.fused.launch import SUM_BLOCK, row_settings

PROGRAMS = 528  # stands in for the GPU's wave: there is no GPU here to compile the backward on and size it

TRACE = f"""
import json
import torch
from torch._functorch.aot_autograd import aot_function
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
import norms.fused.ops as ops

ops._programs_on = lambda *args: {PROGRAMS}


def forward_and_backward(x, residual, weight, dy):
    y, total, rstd = ops._fused_rms_norm_fwd(x, residual, weight, 768, 1e-6, False, 0)
    return (y, *ops._fused_rms_norm_bwd(dy, dy, total, weight, rstd, 768, 0))


class Traced(Exception):
    pass


def compiler(graph, inputs):  # the AOT stage's forward graph, as Inductor would get it
    kernels = [
        [kernel_side_table.get_kernel(node.kwargs["kernel_idx"]).fn.__name__, list(node.kwargs["grid"][0])]
        for node in graph.graph.nodes
        if node.target is torch.ops.higher_order.triton_kernel_wrapper_functional
    ]
    raise Traced(json.dumps({{"kernels": kernels, "opaque": "normlab" in graph.code}}))


with FakeTensorMode():
    x = torch.empty(4096, 768, device="cuda", dtype=torch.bfloat16)
    weight = torch.empty(768, device="cuda", dtype=torch.float32)
    try:
        aot_function(forward_and_backward, fw_compiler=compiler)(x, x, weight, x)
    except Traced as traced:
        print(traced)
"""


def test_the_compiled_graph_holds_the_kernels_with_their_grids():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", TRACE], cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    traced = json.loads(result.stdout.strip().splitlines()[-1])
    forward_rows = row_settings(768, 2).forward.rows
    assert traced == {
        "kernels": [
            ["rms_norm_fwd_kernel", [4096 // forward_rows, 1, 1]],
            ["rms_norm_bwd_kernel", [PROGRAMS, 1, 1]],
            ["sum_partials_kernel", [768 // SUM_BLOCK, 1, 1]],
        ],
        "opaque": False,
    }
