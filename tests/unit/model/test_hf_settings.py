"""model/hf_settings.py reads a config.json as transformers does: its defaults for keys left out are transformers'."""

import pytest

from model.hf_settings import DEFAULTS, HF_CLASSES, hf_model_config

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("kind", DEFAULTS)
def test_the_defaults_are_transformers_own(kind):
    config = getattr(transformers, HF_CLASSES[kind].replace("ForCausalLM", "Config"))()
    assert {key: getattr(config, key) for key in DEFAULTS[kind]} == DEFAULTS[kind]


def test_bare_minimum_config_reads_with_every_default():
    cfg = hf_model_config({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
                           "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2})  # fmt: skip
    assert (cfg.head_dim, cfg.n_kv_heads, cfg.max_seq_len, cfg.norm.eps) == (128, 2, 32768, 1e-6)
    assert (cfg.rope_theta, cfg.tie_embeddings, cfg.norm.qk, cfg.norm.qk_axis) == (10000.0, False, "rmsnorm", "head")


@pytest.mark.parametrize(
    "change, named",
    [
        ({"num_attention_heads": True}, "num_attention_heads=True is not a whole number >= 1"),
        ({"hidden_size": 30}, "has no head_dim"),  # 30 features over 4 heads: no head size to derive
        ({"architectures": "LlamaForCausalLM"}, "is not a list of class names"),
        ({"bos_token_id": "1"}, None),  # read by special_token_ids, not here
    ],
)
def test_values_of_the_wrong_type_are_named(change, named):
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
              "num_hidden_layers": 1, "num_attention_heads": 4, **change}  # fmt: skip
    if named is None:
        hf_model_config(config)
        return
    with pytest.raises(ValueError, match=named):
        hf_model_config(config)
