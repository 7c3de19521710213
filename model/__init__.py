"""The LLaMA-style decoder. It builds its norms through ``norms.build_norm`` and nothing else of ours."""

from model.config import ModelConfig
from model.transformer import Transformer

__all__ = ["ModelConfig", "Transformer"]
