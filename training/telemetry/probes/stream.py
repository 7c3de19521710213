"""The residual stream leaving each block: its scale against depth (Peri-LN's figure) and outlier features."""

from __future__ import annotations

from torch import nn

from training.telemetry.probes.base import Probe, feature_kurtosis, rms_and_mean


class ResidualStream(Probe):
    keys = ("act/layers.{i}/stream_rms", "act/layers.{i}/stream_feature_kurtosis")

    def attach(self, model: nn.Module) -> None:
        for index, layer in enumerate(model.layers):
            self.hook(layer, self._measure(index))

    def _measure(self, index: int):
        def measure(module, args, output) -> None:
            self.values[f"act/layers.{index}/stream_rms"] = rms_and_mean(output)[0]
            self.values[f"act/layers.{index}/stream_feature_kurtosis"] = feature_kurtosis(output)

        return measure
