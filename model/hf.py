"""Our decoder as a Hugging Face model: which class matches, its config, and renamed weights.

Three of our variants have an exact Hugging Face twin (all with RMSNorm over all features):

    pre-norm, no QK-norm                       -> LlamaForCausalLM
    pre-norm, QK-norm per head                 -> Qwen3ForCausalLM
    reordered (norm after each branch),
    QK-norm over all heads                     -> Olmo2ForCausalLM

Any other variant (LayerNorm, pRMSNorm, DyT, post or peri placement, ...) is refused with the
feature that has no equivalent. A gain of ``one_plus`` or ``none`` exports as the plain gain
it equals (1 + w, or ones). Our RoPE already uses the rotate-half layout, so q/k weights need
no permutation; our fused q|k|v and gate|up projections are split into separate ones.
"""

from __future__ import annotations

from typing import Any

import torch

from model.transformer import Transformer

HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM"}

# Our norm attribute in a block -> its name in each Hugging Face layer.
_BLOCK_NORMS = {
    "llama": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "qwen3": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "olmo2": {"attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"},
}


def hf_model_type(model: Transformer) -> str:
    """``llama``, ``qwen3`` or ``olmo2``; a ValueError naming what has no equivalent otherwise."""
    cfg = model.cfg
    if model.on_sphere:
        raise ValueError(
            "nGPT (norm=ngpt) has no equivalent in Hugging Face's Llama, Qwen3 or OLMo 2 classes: its blocks move a "
            "unit hidden state by learned steps, its q and k are unit and scaled by s_qk, its logits by s_z"
        )
    features = {
        "model.logit_softcap": cfg.logit_softcap is not None,
        "model.attn_softcap": cfg.attn_softcap is not None,
        f"model.embed_scale={cfg.embed_scale}": cfg.embed_scale != "none",
        "norm.layer_placements": cfg.layer_placements is not None,
        "model.residual_scale": cfg.residual_scale is not None,
        "model.outer_norm": cfg.outer_norm is not None,
        # Qwen3-Next gates its attention and gpt-oss has sinks, but beside other changes (linear attention, experts)
        f"model.attn_gate={cfg.attn_gate}": cfg.attn_gate != "none",
        f"model.attn_sink={cfg.attn_sink}": cfg.attn_sink != "none",
        "norm.v": cfg.v_norm is not None,
        "norm.after_linear": cfg.after_linear_norm is not None,
    }
    unheld = [feature for feature, used in features.items() if used]
    if unheld:
        raise ValueError(f"{unheld[0]} has no equivalent in Hugging Face's Llama, Qwen3 or OLMo 2 classes")
    norms = model.norm_modules()
    not_rms = [name for name, norm in norms.items() if norm.plain_rms_norm_weight() is None]
    if not_rms:
        raise ValueError(
            f"{not_rms[0]} ({type(norms[not_rms[0]]).__name__}, norm={cfg.norm}, qk={cfg.qk_norm}, options "
            f"{cfg.norm_options}) has no equivalent in Hugging Face's Llama, Qwen3 or OLMo 2, which only have "
            "RMSNorm over all features"
        )
    if len({norm.eps for norm in norms.values()}) > 1:
        raise ValueError("the norms use different eps values; Hugging Face's classes have one rms_norm_eps")
    if cfg.placement == "pre" and cfg.qk_norm is None:
        return "llama"
    if cfg.placement == "pre" and cfg.qk_axis == "head":
        return "qwen3"
    if cfg.placement == "reordered" and cfg.qk_norm is not None and cfg.qk_axis == "all":
        return "olmo2"
    raise ValueError(
        f"placement {cfg.placement!r} with QK-norm {cfg.qk_norm or 'none'}"
        f"{f' over {cfg.qk_axis}' if cfg.qk_norm else ''} has no Hugging Face equivalent: Llama is pre-norm "
        "without QK-norm, Qwen3 pre-norm with per-head QK-norm (norm.qk_axis=head), OLMo 2 reordered with QK-norm "
        "over all heads (norm.placement=reordered norm.qk=rmsnorm norm.qk_axis=all)"
    )


def hf_config(model: Transformer) -> dict[str, Any]:
    """The config.json of the equivalent Hugging Face model."""
    model_type, cfg = hf_model_type(model), model.cfg
    config = {
        "architectures": [HF_CLASSES[model_type]],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": next(iter(model.norm_modules().values())).eps,
        # Older transformers read rope_theta, newer ones rope_parameters; both are given.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
    }
    if model_type == "qwen3":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers)
    return config


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our parameters under the Hugging Face names; a tied LM head is left to HF's tying."""
    model_type, cfg = hf_model_type(model), model.cfg
    out = {"model.embed_tokens.weight": model.tok_embeddings.weight, "model.norm.weight": _rms(model.final_norm)}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    for i, layer in enumerate(model.layers):
        theirs = f"model.layers.{i}."
        q, k, v = layer.attn.qkv_proj.weight.split([q_rows, kv_rows, kv_rows])
        gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
        out.update(
            {
                theirs + "self_attn.q_proj.weight": q,
                theirs + "self_attn.k_proj.weight": k,
                theirs + "self_attn.v_proj.weight": v,
                theirs + "self_attn.o_proj.weight": layer.attn.o_proj.weight,
                theirs + "mlp.gate_proj.weight": gate,
                theirs + "mlp.up_proj.weight": up,
                theirs + "mlp.down_proj.weight": layer.mlp.down_proj.weight,
            }
        )
        for ours, their_name in _BLOCK_NORMS[model_type].items():
            out[f"{theirs}{their_name}.weight"] = _rms(getattr(layer, ours))
        if layer.attn.has_qk_norm:
            out[theirs + "self_attn.q_norm.weight"] = _rms(layer.attn.q_norm)
            out[theirs + "self_attn.k_norm.weight"] = _rms(layer.attn.k_norm)
    return {name: tensor.detach().float().contiguous().clone() for name, tensor in out.items()}


def _rms(norm) -> torch.Tensor:
    return norm.plain_rms_norm_weight()
