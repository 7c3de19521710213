"""The LLaMA-style decoder. It builds its norms through ``norms.build_norm`` and nothing else of ours."""

from model.config import ModelConfig
from model.registry import PLACEMENTS
from model.transformer import Transformer
from norms.registry import resolve


def build_model(cfg: ModelConfig) -> Transformer:
    """The model ``cfg`` describes: the Transformer, or the model class its placement names (model/registry.py)."""
    chosen = resolve(PLACEMENTS[cfg.placement])
    if isinstance(chosen, type) and issubclass(chosen, Transformer):
        return chosen(cfg)
    return Transformer(cfg)


__all__ = ["ModelConfig", "Transformer", "build_model"]
