"""The LLaMA-style decoder. It builds its norms through ``norms.build_norm`` and nothing else of ours."""

from model.config import ModelConfig, NormConfig
from model.transformer import Transformer


def build_model(cfg: ModelConfig) -> Transformer:
    """The model ``cfg`` describes, its classes assembled once (model/assembly.py): the Transformer, or the model
    class its placement names."""
    from model.assembly import assemble

    assembly = assemble(cfg)
    return (assembly.model or Transformer)(cfg, assembly.blocks)


__all__ = ["ModelConfig", "NormConfig", "Transformer", "build_model"]
