"""Our decoder as a Hugging Face ``LlamaForCausalLM``: its config and renamed weights.

Only RMSNorm over all features exists in Llama, so LayerNorm and pRMSNorm models cannot be
exported. Our RoPE already uses Hugging Face's rotate-half layout, so q/k weights need no
permutation; our fused q|k|v and gate|up projections are split into Llama's separate ones.
"""

from __future__ import annotations

from typing import Any

import torch

from model.config import ModelConfig

_RENAMES = {
    "attn.o_proj": "self_attn.o_proj",
    "mlp.down_proj": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
}


def check_exportable(cfg: ModelConfig) -> None:
    full_rms = cfg.norm in ("rmsnorm", "fused_rmsnorm") and cfg.norm_options.get("k") is None
    full_rms = full_rms and cfg.norm_options.get("p") is None
    if not full_rms:
        raise ValueError(
            f"norm {cfg.norm!r} with options {cfg.norm_options} has no Llama equivalent: "
            "LlamaForCausalLM only has RMSNorm over all features. Only rmsnorm and fused_rmsnorm "
            "(without k or p) models can be exported."
        )


def hf_llama_config(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json of the equivalent ``LlamaForCausalLM``."""
    check_exportable(cfg)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_options.get("eps", 1e-6),
        # Older transformers read rope_theta, newer ones rope_parameters; both are given.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
    }


def hf_llama_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename our parameters to ``LlamaForCausalLM``'s; a tied LM head is left to HF's tying."""
    check_exportable(cfg)
    out = {
        "model.embed_tokens.weight": state["tok_embeddings.weight"],
        "model.norm.weight": state["final_norm.weight"],
    }
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i in range(cfg.n_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        q, k, v = state[ours + "attn.qkv_proj.weight"].split([q_rows, kv_rows, kv_rows])
        gate, up = state[ours + "mlp.gate_up_proj.weight"].chunk(2)
        out.update(
            {
                theirs + "self_attn.q_proj.weight": q,
                theirs + "self_attn.k_proj.weight": k,
                theirs + "self_attn.v_proj.weight": v,
                theirs + "mlp.gate_proj.weight": gate,
                theirs + "mlp.up_proj.weight": up,
            }
        )
        for our_name, their_name in _RENAMES.items():
            out[f"{theirs}{their_name}.weight"] = state[f"{ours}{our_name}.weight"]
    return {name: tensor.detach().contiguous().clone() for name, tensor in out.items()}
