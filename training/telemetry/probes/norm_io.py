"""What each norm sees and emits, found by type so the statistics are right in every placement.

``in_*`` describe the norm's input (the residual stream for a norm before a branch, the branch
output for one after it, q or k for QK-norm; the role is in the run's ``runtime.norm_roles``);
``out_*`` its output. With a residual the norm returns ``(N(x + r), x + r)``: it sees the sum.
"""

from __future__ import annotations

from torch import nn

from norms import Norm
from training.telemetry.probes.base import Probe, feature_kurtosis, kurtosis, rms_and_mean


class NormInputOutput(Probe):
    keys = (
        "act/{norm}/in_rms",
        "act/{norm}/in_mean",
        "act/{norm}/in_std",
        "act/{norm}/in_absmax",
        "act/{norm}/in_kurtosis",  # large: outlier elements
        "act/{norm}/in_feature_kurtosis",  # large: outlier features
        "act/{norm}/out_rms",
        "act/{norm}/out_mean",
        "act/{norm}/gain_mean",  # norms with a gain
        "act/{norm}/gain_std",
        "act/{norm}/saturated",  # DyT, Derf: the share of inputs in the flat part of the squash
    )

    def attach(self, model: nn.Module) -> None:
        for name, module in model.named_modules():
            if isinstance(module, Norm):
                self.hook(module, self._measure(name))

    def _measure(self, name: str):
        def measure(module: Norm, args, output) -> None:
            seen, normalized = (output[1], output[0]) if isinstance(output, tuple) else (args[0], output)
            flat = seen.detach().double().flatten()
            in_rms, in_mean = rms_and_mean(flat)
            out_rms, out_mean = rms_and_mean(normalized)
            stats = {
                "in_rms": in_rms,
                "in_mean": in_mean,
                "in_std": flat.std(correction=0).item(),
                "in_absmax": flat.abs().max().item(),
                "in_kurtosis": kurtosis(flat),
                "in_feature_kurtosis": feature_kurtosis(seen),
                "out_rms": out_rms,
                "out_mean": out_mean,
            }
            gain = module.effective_gain()
            if gain is not None:
                stats.update(gain_mean=gain.mean().item(), gain_std=gain.std().item())
            if hasattr(module, "saturated_fraction"):
                stats["saturated"] = module.saturated_fraction(seen)
            self.values.update({f"act/{name}/{key}": value for key, value in stats.items()})

        return measure
