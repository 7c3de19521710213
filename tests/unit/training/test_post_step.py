"""training/step/post_step.py: the hooks after each optimizer step, the model's first, then each set option's."""

import pytest
import torch
from omegaconf import OmegaConf

from model import ModelConfig, NormConfig, build_model
from training.step.distributed import Distributed
from training.step.post_step import post_step_hooks
from variants.qk_clip import QKClip


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def train_cfg(qk_clip=None):
    return OmegaConf.create({"qk_clip": qk_clip})


def test_a_plain_model_without_options_registers_no_hook():
    assert post_step_hooks(build_model(tiny()), train_cfg(), Distributed()) == []


def test_qk_clip_registers_its_hook_which_reports_the_heads_it_clipped():
    model = build_model(tiny())
    (hook,) = post_step_hooks(model, train_cfg(qk_clip=1e-3), Distributed())
    assert isinstance(hook, QKClip)
    model(torch.randint(0, 97, (2, 8)))  # the attentions keep this step's largest logits
    before = model.layers[0].attn.qkv_proj.weight.detach().clone()
    assert hook() == {"train/qk_clipped_heads": 2 * 4}  # every head of both layers is over tau = 1e-3
    assert not torch.equal(model.layers[0].attn.qkv_proj.weight, before)


def test_ngpt_registers_its_renormalization_and_refuses_qk_clip():
    ngpt = tiny(tie_embeddings=False, norm=NormConfig(name="l2norm", placement="ngpt"))
    model = build_model(ngpt)
    assert post_step_hooks(model, train_cfg(), Distributed()) == [model.normalize_weights]
    with pytest.raises(ValueError, match="drop train.qk_clip"):
        post_step_hooks(model, train_cfg(qk_clip=50.0), Distributed())
