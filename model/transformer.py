"""A LLaMA-style decoder whose every norm comes from ``norms.build_norm``.

Pre-norm blocks, RoPE, grouped-query attention, SwiGLU, no biases in linear layers. Norm
instances have stable names (``layers.3.attn_norm``, ``layers.3.mlp_norm``, ``final_norm``)
that telemetry hooks by.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import Attention, KVCache
from model.config import ModelConfig
from model.loss import fused_linear_cross_entropy
from model.rope import rope_tables
from norms import build_norm


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up projections in one matmul: rows [gate | up].
        self.gate_up_proj = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = build_norm(cfg.norm, cfg.d_model, **cfg.norm_options)
        self.attn = Attention(cfg)
        self.mlp_norm = build_norm(cfg.norm, cfg.d_model, **cfg.norm_options)
        self.mlp = SwiGLU(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        attn_out = self.dropout(self.attn(self.attn_norm(x), cos, sin, cache, start_pos))
        # h = x + attn_out and its normalization, in one pass when the norm is fused.
        mlp_in, h = self.mlp_norm(attn_out, residual=x)
        return h + self.dropout(self.mlp(mlp_in))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = build_norm(cfg.norm, cfg.d_model, **cfg.norm_options)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; residual-branch output projections scaled by 1/sqrt(2 * n_layers).

        Norms draw no random numbers (gains start at one), so a given seed gives the same
        weights whichever norm is configured.
        """
        out_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_output = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, mean=0.0, std=out_std if is_output else self.cfg.init_std)

    def norm_modules(self) -> dict[str, nn.Module]:
        """Every norm instance by its stable dotted name, in the order the residual stream meets them."""
        names = [f"layers.{i}.{which}" for i in range(self.cfg.n_layers) for which in ("attn_norm", "mlp_norm")]
        return {name: self.get_submodule(name) for name in [*names, "final_norm"]}

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab) for token ids (batch, seq); with ``targets``, the mean loss instead.

        The loss fuses the LM head with the cross-entropy (model/loss.py), so training never
        materializes the logits.
        """
        seq = tokens.shape[1]
        if start_pos + seq > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start_pos + seq} tokens exceeds model.max_seq_len={self.cfg.max_seq_len}")
        cos = self.rope_cos[start_pos : start_pos + seq]
        sin = self.rope_sin[start_pos : start_pos + seq]
        x = self.tok_embeddings(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], start_pos)
        x = self.final_norm(x)
        if targets is not None:
            return fused_linear_cross_entropy(x, self.lm_head.weight, targets)
        return self.lm_head(x)

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Sample ``max_new_tokens`` after ``prompt`` (batch, seq); temperature 0 is greedy.

        With the key/value cache each new token runs one position through the model;
        ``use_cache=False`` recomputes the whole sequence every step (for checking).
        """
        total = prompt.shape[1] + max_new_tokens
        if total > self.cfg.max_seq_len:
            raise ValueError(f"prompt + max_new_tokens = {total} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        caches = None
        if use_cache:
            like = self.tok_embeddings.weight
            caches = [
                KVCache(prompt.shape[0], self.cfg.n_kv_heads, total, self.cfg.head_dim, like)
                for _ in range(self.cfg.n_layers)
            ]
        tokens, start, step_input = prompt, 0, prompt
        for _ in range(max_new_tokens):
            if use_cache:
                logits = self(step_input, caches=caches, start_pos=start)[:, -1]
                start += step_input.shape[1]
            else:
                logits = self(tokens)[:, -1]
            next_token = _sample(logits.float(), temperature, top_k, generator)
            tokens = torch.cat([tokens, next_token], dim=1)
            step_input = next_token
        return tokens

    def matmul_params(self) -> int:
        """Parameters that take part in matrix multiplies: every Linear, the LM head counted once."""
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token: 6N for the matmuls (forward + backward) plus attention scores.

        Attention adds 12 * n_layers * d_model * seq_len per token (QK^T and AV, forward and
        backward, counted over the full square as kernels compute it; PaLM appendix B).
        """
        return 6 * self.matmul_params() + 12 * self.cfg.n_layers * self.cfg.n_heads * self.cfg.head_dim * seq_len


def _sample(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None):
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
