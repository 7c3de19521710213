"""The LLaMA-style decoder. It builds its norms through ``norms.build_norm`` and nothing else of ours."""

import importlib

from model.config import ModelConfig
from model.transformer import Transformer

# Placements that are a model of their own rather than a block of the Transformer, imported when chosen.
MODELS = {"ngpt": "model.ngpt:NormalizedTransformer"}


def build_model(cfg: ModelConfig) -> Transformer:
    """The model ``cfg`` describes: the Transformer, or the model class its placement names (nGPT's)."""
    path = MODELS.get(cfg.placement)
    if path is None:
        return Transformer(cfg)
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)(cfg)


__all__ = ["MODELS", "ModelConfig", "Transformer", "build_model"]
