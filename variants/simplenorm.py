"""SimpleNorm (SimpleGPT, arXiv 2602.01212): a norm right after every linear layer of the blocks.

``norm.after_linear=<type>`` normalizes the output of the q, k, v and output projections (each as a whole, over
all heads) and of the MLP's gate, up and down projections, with norms of that type (roles ``q_proj`` ...
``down_proj``). SimpleGPT's blocks keep pre-norm, whose input norm then only adds a gain; post-norm and
DeepNorm compose too. A placement that normalizes a projection's output again (a branch's output, or q, k and v)
does not.
"""

from __future__ import annotations

import torch

from model.attention import Attention
from model.blocks import Block
from model.config import ModelConfig
from model.mlp import SwiGLU
from model.norm_roles import norm_for


def refusal(cfg: ModelConfig) -> str | None:
    if cfg.norm.qk is not None or cfg.norm.v is not None:
        roles = ", ".join(key for key, value in (("norm.qk", cfg.norm.qk), ("norm.v", cfg.norm.v)) if value)
        return (
            f"norm.after_linear normalizes q, k and v after their projections, which {roles} normalizes again: "
            "drop one of them"
        )
    return None


class SimpleNormAttention(Attention):
    """Attention with each projection's output normalized as a whole: q, k, v before RoPE, and the output."""

    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        super().__init__(cfg, normed)
        if self.normed_roles:
            raise ValueError(
                f"norm.after_linear normalizes q, k and v after their projections, which the placement normalizes "
                f"again ({', '.join(self.normed_roles)}): use it with norm.placement=pre, post or deepnorm"
            )
        q_size, kv_size = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        for name, size in (("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size), ("o_proj", cfg.d_model)):
            setattr(self, f"{name}_norm", norm_for(cfg, name, size, cfg.norm.after_linear))

    @property
    def normalizes_qk(self) -> bool:
        return True

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v = self.split_qkv(self.qkv_proj(x))
        return self.rotate_heads(self.q_proj_norm(q), self.k_proj_norm(k), self.v_proj_norm(v), cos, sin)

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        return self.o_proj_norm(self.o_proj(out))


class SimpleNormSwiGLU(SwiGLU):
    """down_n(down(silu(gate_n(gate(x))) * up_n(up(x))))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.gate_proj_norm = norm_for(cfg, "gate_proj", cfg.hidden_dim, cfg.norm.after_linear)
        self.up_proj_norm = norm_for(cfg, "up_proj", cfg.hidden_dim, cfg.norm.after_linear)
        self.down_proj_norm = norm_for(cfg, "down_proj", cfg.d_model, cfg.norm.after_linear)

    def project_in(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = super().project_in(x)
        return self.gate_proj_norm(gate), self.up_proj_norm(up)

    def project_out(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj_norm(self.down_proj(hidden))


class SimpleNormBlock(Block):
    """Refuses a placement that normalizes a projection's output again: a branch's output, or q, k and v."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        if self.normalizes_branch_output or self.attention_norms:
            raise ValueError(
                f"norm.after_linear normalizes every projection's output, which {type(self).base_block().__name__} normalizes "
                "again: use it with norm.placement=pre (SimpleGPT's blocks, whose input norm only adds a gain "
                "there), post or deepnorm"
            )
        super().__init__(cfg, layer)


ATTENTION, MLP = SimpleNormAttention, SimpleNormSwiGLU
BLOCK = SimpleNormBlock
