"""nGPT, the normalized Transformer (Loshchilov, Hsieh, Sun & Ginsburg, ICLR 2025, arXiv 2410.01131): a model of its own.

In nGPT every vector lives on the unit sphere: token embeddings, the rows of every matrix along
d_model, queries and keys, and the hidden state. ``NormalizedTransformer`` is the Transformer with

- ``NGPTBlock``: the hidden state moved along the sphere by learned steps, no final norm;
- ``NGPTAttention``: q and k normalized per head after RoPE and scaled by ``s_qk``; the softmax
  scale sqrt(d_head) instead of 1/sqrt(d_head), since unit q and k give dot products in [-1, 1];
- ``NGPTMLP``: SwiGLU with its gate and up projections scaled by ``s_v`` (times sqrt(d_model)) and ``s_u``;
- logits scaled by ``s_z``, each learned vector a ``ScaledVector`` stored the paper's way (Sec. 2.6);
- ``normalize_weights``: every matrix back on the sphere along d_model, a post-step hook the training
  loop runs after each optimizer step.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import Attention, KVCache
from model.blocks import Block
from model.config import ModelConfig
from model.mlp import SwiGLU
from model.norm_roles import norm_for
from model.rope import apply_rope
from model.transformer import Transformer
from norms import Norm


class ScaledVector(nn.Module):
    """A learned vector used as ``weight * (init / scale)``: it starts at ``init``, while the optimizer steps a
    parameter of size ``scale`` (nGPT's Sec. 2.6: so one learning rate suits vectors of every size)."""

    keep_float32 = (
        True  # a scale, like a norm's gain: kept float32 under any mixed-precision policy (training/step/fsdp.py)
    )

    def __init__(self, size: int, init: float, scale: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), float(scale)))
        self.factor = init / scale

    def forward(self) -> torch.Tensor:
        return self.weight * self.factor

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, init={self.factor * self.weight.detach().flatten()[0].item():g} at start"


def base_scale(cfg: ModelConfig) -> float:
    """1 / sqrt(d_model): the stored scale of nGPT's vectors that start at a value of order one."""
    return 1 / math.sqrt(cfg.d_model)


@torch.no_grad()
def normalize_along(weight: torch.Tensor, dim: int) -> None:
    """Put every vector of ``weight`` along ``dim`` (its d_model axis) on the unit sphere, in place, so views
    of the weight (an optimizer's included) see it: dim 1 for a projection from the stream (rows of
    (out, d_model)), dim 0 for one into the stream (columns of (d_model, in)), as the paper's code does."""
    weight.div_(weight.norm(dim=dim, keepdim=True).clamp_min(1e-12))


class NGPTAttention(Attention):
    """Grouped-query attention with unit q and k per head after RoPE, scaled by s_qk, softmax scale sqrt(d_head).

    The paper ties q's and k's scale into one ``s_qk`` with as many heads for both; with grouped-query
    attention k has fewer heads, so it has a scale vector of its own (``s_k``), both stored as ``s_qk``'s.
    """

    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        unsupported = {
            "model.attn_gate": cfg.attn_gate != "none",
            "model.attn_sink": cfg.attn_sink != "none",
            "norm.v": cfg.norm.v is not None,
            "norm.after_linear": cfg.norm.after_linear is not None,
        }
        for key, used in unsupported.items():
            if used:
                raise ValueError(f"nGPT's attention (norm=ngpt) has no {key}: drop it, or choose another norm")
        super().__init__(cfg, normed)
        if cfg.attn_softcap is not None:
            raise ValueError("nGPT's attention logits are bounded by its unit q and k: drop model.attn_softcap")
        unit = dataclasses.replace(cfg, norm=dataclasses.replace(cfg.norm, qk=cfg.norm.name))  # q, k: the L2 norm
        self.q_unit, self.k_unit = norm_for(unit, "q", cfg.head_dim), norm_for(unit, "k", cfg.head_dim)
        self.s_q = ScaledVector(cfg.n_heads * cfg.head_dim, init=1.0, scale=base_scale(cfg))
        self.s_k = ScaledVector(cfg.n_kv_heads * cfg.head_dim, init=1.0, scale=base_scale(cfg))
        self.score_scale = math.sqrt(cfg.head_dim)

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        batch, seq, _ = x.shape
        qk, v = self._heads(self.qkv_proj(x), self.n_heads + 2 * self.n_kv_heads).split(
            [self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1
        )
        q, k = apply_rope(qk, cos, sin).split([self.n_heads, self.n_kv_heads], dim=1)
        q = self.q_unit(q) * self.s_q().view(self.n_heads, 1, self.head_dim)
        k = self.k_unit(k) * self.s_k().view(self.n_kv_heads, 1, self.head_dim)
        if cache is not None:
            k, v = cache.update(k, v, start_pos)
        self.scores_tap(q, k, start_pos)
        out = self._sdpa(q, k, v, start_pos, scale=self.score_scale)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class NGPTMLP(SwiGLU):
    """SwiGLU with u <- s_u * u and v <- s_v * sqrt(d_model) * v (v the gate), as the paper's Sec. 2.4.

    (The authors' code multiplies both halves by sqrt(d_model); the paper's equations, followed here,
    put it on the gate's input only, where it keeps SiLU out of its linear regime for unit inputs.)
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.sqrt_d = math.sqrt(cfg.d_model)
        self.s_v = ScaledVector(cfg.hidden_dim, init=1.0, scale=1.0)
        self.s_u = ScaledVector(cfg.hidden_dim, init=1.0, scale=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate * (self.s_v() * self.sqrt_d)) * (up * self.s_u()))


class NGPTBlock(Block):
    """h <- N(h + alpha_A * (N(attn(h)) - h)); out <- N(h + alpha_M * (N(mlp(h)) - h)).

    nGPT (Loshchilov et al. 2025, arXiv 2410.01131): N puts a vector on the unit sphere, and each
    branch moves the hidden state towards its own (normalized) suggestion by a learned per-feature
    step, the "eigen learning rates" alpha_A and alpha_M (init 0.05, stored at scale 1/sqrt(d_model);
    used as |alpha|, as the authors' code does).
    q and k are unit per head and scaled by s_qk, the MLP's inputs by s_u and s_v;
    the model scales its logits by s_z and has no final norm; every matrix stays unit-norm along
    d_model (``normalize_weights``, after each optimizer step).
    """

    roles = ("attn_out", "attn_update", "mlp_out", "mlp_update")
    has_final_norm = False
    attention_class, mlp_class = NGPTAttention, NGPTMLP

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        if cfg.tie_embeddings:
            raise ValueError("nGPT has separate input and output embeddings: set model.tie_embeddings=false")
        if cfg.norm.qk is not None:
            raise ValueError(f"nGPT normalizes q and k itself: drop norm.qk={cfg.norm.qk}")
        super().__init__(cfg, layer)
        off_sphere = sorted({type(n).__name__ for n in self.modules() if isinstance(n, Norm) and not n.unit_sphere})
        if off_sphere:
            raise ValueError(
                f"the nGPT block keeps its hidden state on the unit sphere, which {', '.join(off_sphere)} does not: "
                "use norm=ngpt (an L2 norm)"
            )
        self.attn_alpha = ScaledVector(cfg.d_model, init=0.05, scale=base_scale(cfg))
        self.mlp_alpha = ScaledVector(cfg.d_model, init=0.05, scale=base_scale(cfg))

    def forward(self, h, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        attn = self.attn_out_norm(self.attn(h, cos, sin, cache, start_pos))
        h = self.attn_update_norm(h + self.attn_alpha().abs() * (attn - h))
        mlp = self.mlp_out_norm(self.mlp(h))
        return self.mlp_update_norm(h + self.mlp_alpha().abs() * (mlp - h))

    def init_stds(self) -> dict[str, float]:
        return {}  # every matrix is normalized after init, so its std does not matter


class NormalizedTransformer(Transformer):
    """The Transformer with nGPT's blocks in every layer, logits scaled by s_z, and its matrices and embeddings
    kept unit-norm along d_model: at init, and after every optimizer step (``post_step_hooks``)."""

    on_sphere = True
    layer_block = NGPTBlock  # every layer's (model/assembly.py)

    def __init__(self, cfg: ModelConfig, blocks: tuple[type[Block], ...] | None = None) -> None:
        super().__init__(cfg, blocks)
        # nGPT's logits are s_z * (h . w): unit h and unit w give cosines, which s_z scales (init 1)
        self.logit_scale = ScaledVector(cfg.vocab_size, 1.0, base_scale(cfg))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.normalize_weights()

    @torch.no_grad()
    def normalize_weights(self) -> dict[str, float]:
        """nGPT's constraint: the embeddings and every matrix unit-norm along d_model. A post-step hook (it
        reports no metric)."""
        for table in (self.tok_embeddings, self.lm_head):
            normalize_along(table.weight, dim=1)
        for layer in self.layers:
            for from_stream in (layer.attn.qkv_proj, layer.mlp.gate_up_proj):
                normalize_along(from_stream.weight, dim=1)
            for into_stream in (layer.attn.o_proj, layer.mlp.down_proj):
                normalize_along(into_stream.weight, dim=0)
        return {}

    def post_step_hooks(self) -> list:
        return [self.normalize_weights]

    def head_weight(self) -> torch.Tensor:
        # s_z * (h . w_j) = h . (s_z,j w_j): the fused loss keeps working
        return super().head_weight() * self.logit_scale()[:, None]
