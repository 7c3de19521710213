"""A LLaMA-style decoder whose every norm comes from ``norms.build_norm``.

RoPE, grouped-query attention (optionally with QK-norm), SwiGLU, no biases in linear layers;
the norms' placement is a block variant (model/blocks.py). Norm instances have stable names
(``layers.3.attn_norm``, ``layers.3.attn_out_norm``, ``layers.3.attn.q_norm``, ``final_norm``)
that telemetry finds by type and reports under.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import KVCache
from model.blocks import Block
from model.config import ModelConfig
from model.loss import LossTerms, fused_linear_cross_entropy, softcap, summed_cross_entropy
from model.norm_roles import norm_for
from model.rope import rope_tables
from norms import Norm

# Positions the RoPE tables hold when the model is built; a longer context extends them when a sequence reaches
# past (``rope``), so a config that declares a context of a billion positions allocates only what runs.
ROPE_POSITIONS = 8192


class Transformer(nn.Module):
    on_sphere = False  # whether the model keeps its vectors on the unit sphere (no gain folds into a matrix)

    def __init__(self, cfg: ModelConfig, blocks: tuple[type[Block], ...] | None = None) -> None:
        """``blocks``: each layer's class, as ``model.assembly.assemble(cfg)`` gives them (assembled here if not
        given: ``build_model`` builds a placement's own model class)."""
        super().__init__()
        self.cfg = cfg
        if blocks is None:
            from model.assembly import assemble

            assembly = assemble(cfg)
            if assembly.model is not None and not isinstance(self, assembly.model):
                raise ValueError(
                    f"norm.placement={cfg.norm.placement} is a model of its own ({assembly.model.__name__}): build it "
                    "with model.build_model"
                )
            blocks = assembly.blocks
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.embed_scale == "learned":  # the DyT paper's LLaMA code: a learned scalar, from sqrt(d_model)
            self.embed_scale = nn.Parameter(torch.tensor(math.sqrt(cfg.d_model)))
        # a norm on the embeddings, where a stack without norms starts (outer_norm: both ends of the stack)
        self.embed_norm = norm_for(cfg, "embed", cfg.d_model) if cfg.outer_norm is not None else None
        self.layers = nn.ModuleList(block(cfg, layer) for layer, block in enumerate(blocks))
        has_final_norm = blocks[-1].has_final_norm or cfg.outer_norm is not None
        self.final_norm = norm_for(cfg, "final", cfg.d_model) if has_final_norm else None
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        self.build_rope(min(cfg.max_seq_len, ROPE_POSITIONS))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) weights: init_std, or what the block says for its weights (``Block.init_stds``:
        output projections at init_std / sqrt(2 * n_layers) by default).

        Norms draw no random numbers (gains start at one), and weights only some variants have (marked
        ``drawn_last``) are drawn after all the others, so a given seed gives the same shared weights whichever
        norm or switch is configured: runs of one seed pair across arms.
        """
        stds = {
            f"layers.{i}.{name}": std for i, layer in enumerate(self.layers) for name, std in layer.init_stds().items()
        }
        drawn = [(n, m) for n, m in self.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
        for name, module in sorted(drawn, key=lambda item: getattr(item[1], "drawn_last", False)):  # stable
            nn.init.normal_(module.weight, mean=0.0, std=stds.get(name, self.cfg.init_std))
        for layer in self.layers:
            layer.after_init()

    def post_step_hooks(self) -> list[Callable[[], dict[str, float]]]:
        """What must run after every optimizer step for the weights to stay what the model assumes (a model
        that keeps its matrices normalized); each returns the metrics it reports. None for this model."""
        return []

    def head_weight(self) -> torch.Tensor:
        """The LM head's weight as the logits use it."""
        return self.lm_head.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The token embeddings, times sqrt(d_model) (Gemma) or a learned scalar (DyT) when configured,
        then the embedding norm when ``outer_norm`` is set."""
        x = self.tok_embeddings(tokens)
        if self.cfg.embed_scale == "sqrt_d":
            x = x * math.sqrt(self.cfg.d_model)
        elif self.cfg.embed_scale == "learned":
            x = x * self.embed_scale
        return x if self.embed_norm is None else self.embed_norm(x)

    def build_rope(self, rows: int, device: torch.device | str | None = None) -> None:
        """RoPE's cos and sin tables for the first ``rows`` positions (buffers, not saved: they follow from the
        config), on ``device`` (the default device when None)."""
        cos, sin = rope_tables(self.cfg.head_dim, rows, self.cfg.rope_theta, self.cfg.rope_scaling)
        self.register_buffer("rope_cos", cos.to(device), persistent=False)
        self.register_buffer("rope_sin", sin.to(device), persistent=False)

    def rope(self, start_pos: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin rows for positions ``start_pos`` to ``start_pos + seq``, the tables extended (at least
        doubled, at most to model.max_seq_len) when the sequence reaches past them."""
        end = start_pos + seq
        if end > self.rope_cos.shape[0]:
            self.build_rope(min(max(end, 2 * self.rope_cos.shape[0]), self.cfg.max_seq_len), self.rope_cos.device)
        return self.rope_cos[start_pos:end], self.rope_sin[start_pos:end]

    def norm_modules(self) -> dict[str, Norm]:
        """Every norm instance by its stable dotted name, in the order the forward pass meets them."""
        return {name: module for name, module in self.named_modules() if isinstance(module, Norm)}

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        start_pos: int = 0,
        z_loss: float = 0.0,
        summed: bool = False,
    ) -> torch.Tensor | LossTerms:
        """Logits (batch, seq, vocab) for token ids (batch, seq), soft-capped when configured; with
        ``targets``, the loss terms instead (mean cross-entropy, plus ``z_loss * mean(lse^2)``), or with
        ``summed`` the cross-entropy summed over the tokens (validation's; no gradient).

        The loss fuses the LM head with the cross-entropy (model/loss.py), so training never
        materializes the logits, and validation holds a chunk of them at a time.
        """
        seq = tokens.shape[1]
        if start_pos + seq > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start_pos + seq} tokens exceeds model.max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope(start_pos, seq)
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], start_pos)
        if self.final_norm is not None:
            x = self.final_norm(x)
        head = self.head_weight()
        if summed:
            return summed_cross_entropy(x, head, targets, self.cfg.logit_softcap)
        if targets is not None:
            return fused_linear_cross_entropy(x, head, targets, z_loss, self.cfg.logit_softcap)
        return softcap(F.linear(x, head), self.cfg.logit_softcap)

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
