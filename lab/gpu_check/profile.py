"""Stage 3, profile: where a compiled gpu_125m training step's time goes, kernel by kernel, grouped.

A few steps of the GPU recipe's RMSNorm model (compiled, as train=gpu runs it; warmed up first, so that no compile
is profiled) run under torch.profiler. Every kernel's device time is summed per step and grouped by what it does
(GROUPS: the first pattern a kernel's name matches); the step's wall time less its kernels' is the host's gap,
when the device waits. The table lands in the check's JSON and Markdown: a group's milliseconds per step and its
share of the step, and the top kernels. On a CPU (the dry run) the same table is made of the operators' own CPU
time, which says nothing of a GPU.
"""

from __future__ import annotations

import re
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.profiler import profile as profiler

from lab.gpu_check.stage import Stage
from lab.step_timing import Variant, compose_config, sync
from training.run.setup import configure_device

# (group, pattern over kernel or operator names, case-insensitive), in order: the first that matches names it.
GROUPS = (
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot"),
    ("norms", r"rms_norm|rmsnorm|layer_norm|_norm_|red_fused.*(rsqrt|pow)|rsqrt"),
    ("loss", r"cross_entropy|log_softmax|nll_loss|logsumexp|_softmax|exp_"),
    ("optimizer", r"adam|multi_tensor|foreach|_fused_sgd|lerp|addcdiv|addcmul"),
    ("matmuls", r"gemm|cutlass|sm\d+_xmma|ampere_|hopper|cublas|\bmm\b|addmm|bmm|matmul|linear|nvjet"),
    ("elementwise", r"triton_|elementwise|vectorized|unrolled|copy|fill|add|mul|silu|cat|index|where|clone"),
)
TOP_KERNELS = 12


def group_of(name: str) -> str:
    return next((group for group, pattern in GROUPS if re.search(pattern, name, re.IGNORECASE)), "other")


def profile(stage: Stage) -> None:
    device = stage.device
    configure_device(device)
    cfg = compose_config(stage.overrides)
    seq_len = cfg.train.seq_len or cfg.model.max_seq_len
    tokens = torch.randint(0, cfg.data.vocab_size, (cfg.train.batch_size, seq_len + 1),
                           generator=torch.Generator().manual_seed(cfg.seed)).to(device)  # fmt: skip
    warmup, steps = (1, 1) if stage.dry_run else (3, 4)
    variant = Variant(stage.overrides, "norm=rmsnorm", device)
    stage.progress = "warming up (compiling)"
    variant.steps(tokens, warmup)
    stage.progress = "profiling"
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profiler(activities=activities) as prof:
        started = time.perf_counter()
        variant.steps(tokens, steps)
        sync(device)
        wall_ms = 1000 * (time.perf_counter() - started) / steps
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    if cuda:  # kernels: the events that ran on the device (a CPU operator carries its kernels' time again)
        kernels = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
        spent = {e.key: e.self_device_time_total / 1000 / steps for e in kernels if e.self_device_time_total > 0}
    else:  # operators' own CPU time
        spent = {e.key: e.self_cpu_time_total / 1000 / steps for e in events if e.key.startswith("aten::")}
    groups: dict[str, float] = {}
    for name, ms in spent.items():
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + ms
    groups["host gaps (the device idle)" if cuda else "outside aten operators"] = max(
        wall_ms - sum(spent.values()), 0.0
    )
    what = "kernels' device time" if cuda else "CPU operators' own time"
    stage.notes["profile"] = (
        f"{steps} compiled steps of {cfg.model.name}, norm=rmsnorm, batch {tokens.shape[0]}x{seq_len}, after "
        f"{warmup} warm-up; {what} per step, grouped by name (lab/gpu_check/profile.py GROUPS)"
    )
    for group, ms in sorted(groups.items(), key=lambda item: -item[1]):
        stage.number(f"{group}, ms per step", ms, "ms", f"the step's wall time: {wall_ms:.2f} ms", ms / wall_ms,
                     {"group": group})  # fmt: skip
    for name, ms in sorted(spent.items(), key=lambda item: -item[1])[:TOP_KERNELS]:
        stage.number(f"{name[:90]}, ms per step", ms, "ms", f"group: {group_of(name)}", ms / wall_ms,
                     {"kernel": name, "group": group_of(name)})  # fmt: skip
