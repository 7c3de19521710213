"""How much of the forward pass the norms take, timed on the probe pass (eager, synchronized)."""

from __future__ import annotations

import time

from torch import nn

from norms import Norm
from training.telemetry.probes.base import Probe, sync


class NormTime(Probe):
    """Its hooks are untimed (they are the measurement), and it attaches first, so each norm's
    time ends before any statistic of another probe is computed on that norm's output."""

    keys = ("perf/norm_forward_ms", "perf/norm_time_frac")
    attach_order = -1

    def attach(self, model: nn.Module) -> None:
        self.norm_seconds = 0.0
        device = next(model.parameters()).device
        started = [0.0]

        def before(module, args):
            sync(device)
            started[0] = time.perf_counter()

        def after(module, args, output):
            sync(device)
            self.norm_seconds += time.perf_counter() - started[0]

        for module in model.modules():
            if isinstance(module, Norm):
                self.handles.append(module.register_forward_pre_hook(before))
                self.hook(module, after, timed=False)

    def collect(self, forward_seconds: float) -> dict[str, float]:
        return {
            "perf/norm_forward_ms": 1000 * self.norm_seconds,
            "perf/norm_time_frac": self.norm_seconds / forward_seconds if forward_seconds > 0 else 0.0,
        }
