"""Throughput telemetry: tokens/s, model FLOPs utilization (MFU) and peak memory."""

from __future__ import annotations

import logging
import resource
import sys
import time
from typing import NamedTuple

import torch

log = logging.getLogger(__name__)

# Dense bf16 tensor-core peaks (FLOP/s), from the vendors' data sheets. Matched by substring of
# torch.cuda.get_device_name(); train.peak_flops overrides.
GPU_PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16: V100 has no bf16
    "T4": 65e12,  # fp16
}


def measure_matmul_peak(device: torch.device, size: int = 1024, seconds: float = 0.15, trials: int = 5) -> float:
    """Measured float32 matmul FLOP/s on this device, the best of several trials: the CPU's practical peak.

    A single trial on a busy machine measures the load, not the peak (seen here: 0.089 TFLOP/s
    against a true ~0.28, which made MFU read 142%); the best trial is the closest to the peak.
    """
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b  # warm-up
    best = 0.0
    for _ in range(trials):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        runs, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            a @ b
            runs += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - started
        best = max(best, 2 * size**3 * runs / elapsed)
    return best


class PeakFlops(NamedTuple):
    """The device's peak FLOP/s that MFU divides by, and where the number came from."""

    flops: float
    source: str


def peak_flops(device: torch.device, precision: str, override: float | None) -> PeakFlops:
    """The peak for MFU: ``train.peak_flops``, a GPU's datasheet, or a measured float32 matmul."""
    if override:
        return PeakFlops(override, "train.peak_flops")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in GPU_PEAK_BF16.items():
            if key in name:
                # float32 matmuls run as TF32 on tensor cores: half the bf16 rate.
                return PeakFlops(flops if precision == "bf16" else flops / 2, f"datasheet ({key})")
    return PeakFlops(measure_matmul_peak(device), "measured fp32 matmul")


def peak_memory_gb(device: torch.device) -> float:
    """CUDA allocator peak on GPU; peak resident set size of the process elsewhere."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1e9 if sys.platform == "darwin" else 1e6)  # bytes on macOS, KiB on Linux


class ThroughputMeter:
    """Tokens/s and MFU over the steps since the last report, skipping the first warm-up steps."""

    def __init__(self, flops_per_token: int, peak: float, warmup_steps: int) -> None:
        self.flops_per_token, self.peak, self.warmup_steps = flops_per_token, peak, warmup_steps
        self.steps_seen, self.tokens, self.seconds = 0, 0, 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.steps_seen += 1
        if self.steps_seen > self.warmup_steps:
            self.tokens += tokens
            self.seconds += seconds

    def report(self) -> dict[str, float]:
        """tokens/s and MFU; MFU is left out when above 100%, which can only mean a mis-measured peak."""
        if self.seconds == 0:
            return {}
        tokens_per_sec = self.tokens / self.seconds
        self.tokens, self.seconds = 0, 0.0
        metrics = {"perf/tokens_per_sec": tokens_per_sec}
        mfu = mfu_or_none(tokens_per_sec, self.flops_per_token, self.peak)
        if mfu is not None:
            metrics["perf/mfu"] = mfu
        return metrics


def mfu_or_none(tokens_per_sec: float, flops_per_token: float, peak: float) -> float | None:
    """Model FLOPs utilization, or None (with a warning) when it exceeds 1: the peak was mis-measured."""
    mfu = tokens_per_sec * flops_per_token / peak
    if mfu <= 1.0:
        return mfu
    log.warning(
        "MFU would be %.0f%%: the peak (%.3g FLOP/s) was mis-measured (a busy machine?); not reporting MFU. "
        "Set train.peak_flops to the device's real peak.",
        100 * mfu,
        peak,
    )
    return None
