"""Our decoder as a Hugging Face model and back: which class matches, its config, and renamed weights.

Three of our variants have an exact Hugging Face twin (all with RMSNorm over all features):

    pre-norm, no QK-norm                       <-> LlamaForCausalLM
    pre-norm, QK-norm per head                 <-> Qwen3ForCausalLM
    reordered (norm after each branch),
    QK-norm over all heads                     <-> Olmo2ForCausalLM

Any other variant (LayerNorm, pRMSNorm, DyT, post or peri placement, ...) is refused with the
feature that has no equivalent. A gain of ``one_plus`` or ``none`` exports as the plain gain
it equals (1 + w, or ones). Our RoPE already uses the rotate-half layout, so q/k weights need
no permutation; our fused q|k|v and gate|up projections are split into separate ones.

The import (scripts/import_hf.py) reads the same tables the other way: ``hf_model_config``
(model/hf_settings.py) is ``hf_config``'s inverse and ``load_hf_tensors`` ``hf_state_dict``'s, both
through one name map (``hf_tensor_names``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from model.hf_settings import HF_CLASSES
from model.transformer import Transformer
from norms import Norm

# Our norm attribute in a block -> its name in each Hugging Face layer.
_BLOCK_NORMS = {
    "llama": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "qwen3": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "olmo2": {"attn_out_norm": "post_attention_layernorm", "mlp_out_norm": "post_feedforward_layernorm"},
}
_QK_NORMS = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}


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
        "norm.layer_placements": cfg.norm.layer_placements is not None,
        "model.residual_scale": cfg.residual_scale is not None,
        "model.outer_norm": cfg.outer_norm is not None,
        # Qwen3-Next gates its attention and gpt-oss has sinks, but beside other changes (linear attention, experts)
        f"model.attn_gate={cfg.attn_gate}": cfg.attn_gate != "none",
        f"model.attn_sink={cfg.attn_sink}": cfg.attn_sink != "none",
        "norm.v": cfg.norm.v is not None,
        "norm.after_linear": cfg.norm.after_linear is not None,
    }
    unheld = [feature for feature, used in features.items() if used]
    if unheld:
        raise ValueError(f"{unheld[0]} has no equivalent in Hugging Face's Llama, Qwen3 or OLMo 2 classes")
    norms = model.norm_modules()
    not_rms = [name for name, norm in norms.items() if norm.plain_rms_norm_weight() is None]
    if not_rms:
        raise ValueError(
            f"{not_rms[0]} ({type(norms[not_rms[0]]).__name__}, norm={cfg.norm.name}, qk={cfg.norm.qk}, options "
            f"{cfg.norm.options()}) has no equivalent in Hugging Face's Llama, Qwen3 or OLMo 2, which only have "
            "RMSNorm over all features"
        )
    if len({norm.eps for norm in norms.values()}) > 1:
        raise ValueError("the norms use different eps values; Hugging Face's classes have one rms_norm_eps")
    if cfg.norm.placement == "pre" and cfg.norm.qk is None:
        return "llama"
    if cfg.norm.placement == "pre" and cfg.norm.qk_axis == "head":
        return "qwen3"
    if cfg.norm.placement == "reordered" and cfg.norm.qk is not None and cfg.norm.qk_axis == "all":
        return "olmo2"
    raise ValueError(
        f"placement {cfg.norm.placement!r} with QK-norm {cfg.norm.qk or 'none'}"
        f"{f' over {cfg.norm.qk_axis}' if cfg.norm.qk else ''} has no Hugging Face equivalent: Llama is pre-norm "
        "without QK-norm, Qwen3 pre-norm with per-head QK-norm (norm.qk_axis=head), OLMo 2 reordered with QK-norm "
        "over all heads (norm.placement=reordered norm.qk=rmsnorm norm.qk_axis=all)"
    )


def hf_config(model: Transformer) -> dict[str, Any]:
    """The config.json of the equivalent Hugging Face model."""
    model_type, cfg = hf_model_type(model), model.cfg
    rope = dict(cfg.rope_scaling) or {"rope_type": "default"}
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
        # Older transformers read rope_theta (and rope_scaling), newer ones rope_parameters; both are given.
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {**rope, "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
    }
    if cfg.rope_scaling:
        config["rope_scaling"] = rope
    if model_type == "qwen3":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers)
    return config


def hf_tensor_names(model: Transformer) -> dict[str, list[tuple[str, int]]]:
    """Each of our tensors -> the Hugging Face tensors stacked in its rows, top to bottom, with their row counts:
    the one name map that the export reads one way and the import the other. A tied LM head is left to the tying."""
    model_type, cfg = hf_model_type(model), model.cfg
    whole = {"tok_embeddings.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight"}
    if not cfg.tie_embeddings:
        whole["lm_head.weight"] = "lm_head.weight"
    stacked = {}
    for i, layer in enumerate(model.layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        norms = {**_BLOCK_NORMS[model_type], **(_QK_NORMS if "q" in layer.attn.normed_roles else {})}
        for norm, their_norm in norms.items():
            whole[f"{ours}{norm}.weight"] = f"{theirs}{their_norm}.weight"
        for branch, their_branch in (("attn", "self_attn"), ("mlp", "mlp")):
            for fused, parts in getattr(layer, branch).fused_rows().items():  # q|k|v, gate|up
                stacked[f"{ours}{branch}.{fused}"] = [(f"{theirs}{their_branch}.{p}_proj.weight", n) for p, n in parts]
        whole[f"{ours}attn.o_proj.weight"] = f"{theirs}self_attn.o_proj.weight"
        whole[f"{ours}mlp.down_proj.weight"] = f"{theirs}mlp.down_proj.weight"
    return {**{ours: [(theirs, len(_ours(model, ours)))] for ours, theirs in whole.items()}, **stacked}


def hf_tensor_shapes(model: Transformer) -> dict[str, tuple[int, ...]]:
    """The shape of every Hugging Face tensor the model corresponds to, by name (a model on the meta device will do)."""
    return {
        theirs: (rows, *_ours(model, ours).shape[1:])
        for ours, parts in hf_tensor_names(model).items()
        for theirs, rows in parts
    }


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our parameters under the Hugging Face names; a tied LM head is left to HF's tying."""
    out = {}
    for ours, parts in hf_tensor_names(model).items():
        out.update(zip([theirs for theirs, _ in parts], _ours(model, ours).split([rows for _, rows in parts])))
    return {name: tensor.detach().float().contiguous().clone() for name, tensor in out.items()}


@torch.no_grad()
def load_hf_tensors(model: Transformer, read: Callable[[str], torch.Tensor]) -> None:
    """Fill ``model``'s parameters with Hugging Face tensors (``hf_state_dict``'s inverse), each read by name when
    its turn comes, so that one tensor at a time is held beside the model. The caller checks the names and shapes
    (``hf_tensor_shapes``) first; the model's norms are plain RMSNorms, whose weight is the gain."""
    for ours, parts in hf_tensor_names(model).items():
        target = model.get_parameter(ours)
        for rows, (theirs, _) in zip(target.split([rows for _, rows in parts]), parts):
            rows.copy_(read(theirs))


def _ours(model: Transformer, name: str) -> torch.Tensor:
    """Our tensor ``name`` as Hugging Face holds it: a norm's weight is the plain RMSNorm gain it equals."""
    module = model.get_submodule(name.rpartition(".")[0])
    return module.plain_rms_norm_weight() if isinstance(module, Norm) else model.get_parameter(name)
