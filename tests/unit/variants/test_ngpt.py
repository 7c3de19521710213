"""nGPT (variants/ngpt.py): its block as its formula, unit vectors everywhere, its post-step hook, refusals."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, NormConfig, Transformer, build_model
from model.rope import apply_rope
from training.telemetry.probes import resolve_probe, run_probes
from variants.ngpt import NormalizedTransformer, ScaledVector


def ngpt(norm: dict | None = None, **overrides) -> ModelConfig:
    """nGPT's tiny model; ``norm``: the norm group's fields that differ from nGPT's."""
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    norms = NormConfig(**{"name": "l2norm", "placement": "ngpt", **(norm or {})})
    return ModelConfig(**{**base, "tie_embeddings": False, **overrides}, norm=norms)


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _perturbed(model: Transformer) -> Transformer:
    """Learned scales away from their initial values, so the formula test sees every one of them."""
    torch.manual_seed(1)
    for module in model.modules():
        if isinstance(module, ScaledVector):
            module.weight.data.mul_(torch.empty_like(module.weight).uniform_(0.5, 1.5))
    return model


def test_the_block_computes_the_papers_formula():
    torch.manual_seed(0)
    model = _perturbed(build_model(ngpt()).eval())
    block, (hd, d) = model.layers[0], (8, 32)
    cos, sin = model.rope_cos[:6], model.rope_sin[:6]
    h = unit(torch.randn(2, 6, d))

    def attention(x):
        q, k, v = block.attn.qkv_proj(x).split([4 * hd, 2 * hd, 2 * hd], dim=-1)
        heads = lambda t, n: t.view(2, 6, n, hd).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q, 4), heads(k, 2), heads(v, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        s_q = block.attn.s_q.weight * math.sqrt(d)  # stored at 1/sqrt(d), used from 1
        s_k = block.attn.s_k.weight * math.sqrt(d)
        q, k = unit(q) * s_q.view(4, 1, hd), unit(k) * s_k.view(2, 1, hd)
        scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * math.sqrt(hd)  # sqrt(d_head), not 1/
        scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
        out = scores.softmax(-1) @ v.repeat_interleave(2, dim=1)
        return block.attn.o_proj(out.transpose(1, 2).reshape(2, 6, 4 * hd))

    def mlp(x):
        gate, up = block.mlp.gate_up_proj(x).chunk(2, dim=-1)
        return block.mlp.down_proj(F.silu(gate * block.mlp.s_v.weight * math.sqrt(d)) * (up * block.mlp.s_u.weight))

    alpha_a = (block.attn_alpha.weight * 0.05 * math.sqrt(d)).abs()  # init 0.05, stored at 1/sqrt(d)
    alpha_m = (block.mlp_alpha.weight * 0.05 * math.sqrt(d)).abs()
    with torch.no_grad():
        h1 = unit(h + alpha_a * (unit(attention(h)) - h))
        expected = unit(h1 + alpha_m * (unit(mlp(h1)) - h1))
        torch.testing.assert_close(block(h, cos, sin), expected)
        # No final norm; the logits are s_z times the cosines of the state and each unit output embedding.
        tokens = torch.randint(0, 97, (1, 5))
        x = model.tok_embeddings(tokens)
        for layer in model.layers:
            x = layer(x, model.rope_cos[:5], model.rope_sin[:5])
        s_z = model.logit_scale.weight * math.sqrt(d)
        torch.testing.assert_close(model(tokens), s_z * (x @ model.lm_head.weight.T))
    assert model.final_norm is None


def test_everything_starts_on_the_unit_sphere_and_the_renormalization_puts_it_back():
    model = build_model(ngpt(d_model=32, n_heads=4, n_kv_heads=4))  # o_proj square: the axis must still be d_model's
    block = model.layers[0]
    checks = {
        "embeddings": (model.tok_embeddings.weight, 1),
        "head": (model.lm_head.weight, 1),
        "qkv": (block.attn.qkv_proj.weight, 1),
        "o_proj (into the stream: columns)": (block.attn.o_proj.weight, 0),
        "gate_up": (block.mlp.gate_up_proj.weight, 1),
        "down (into the stream: columns)": (block.mlp.down_proj.weight, 0),
    }
    for name, (weight, dim) in checks.items():
        torch.testing.assert_close(weight.norm(dim=dim), torch.ones(weight.shape[1 - dim]), msg=name)
    with torch.no_grad():
        for weight, _ in checks.values():
            weight.mul_(3.0).add_(0.1)
    (hook,) = model.post_step_hooks()  # the loop runs it after every optimizer step
    assert hook() == {}
    for name, (weight, dim) in checks.items():
        torch.testing.assert_close(weight.norm(dim=dim), torch.ones(weight.shape[1 - dim]), msg=name)


def test_the_hidden_state_leaves_every_block_with_norm_one_and_the_scales_start_where_the_paper_starts():
    torch.manual_seed(0)
    model = build_model(ngpt()).eval()
    x = model.tok_embeddings(torch.randint(0, 97, (2, 7)))
    for layer in model.layers:
        x = layer(x, model.rope_cos[:7], model.rope_sin[:7])
        torch.testing.assert_close(x.norm(dim=-1), torch.ones(2, 7))
    block = model.layers[0]
    assert block.attn_alpha().allclose(torch.full((32,), 0.05)) and block.attn.s_q().allclose(torch.ones(32))
    assert block.attn_alpha.weight[0].item() == pytest.approx(1 / math.sqrt(32))  # stored at the base scale
    assert model.logit_scale().allclose(torch.ones(97))


def test_cached_generation_matches_recomputation():
    torch.manual_seed(0)
    model = build_model(ngpt()).eval()
    prompt = torch.randint(0, 97, (2, 4))
    cached = model.generate(prompt, 10, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 10, temperature=0, use_cache=False))


def test_the_gradient_reaches_every_learned_scale():
    model = build_model(ngpt())
    tokens = torch.randint(0, 97, (2, 9))
    model(tokens[:, :-1], tokens[:, 1:]).objective.backward()
    for name, module in model.named_modules():
        if isinstance(module, ScaledVector):
            assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tie_embeddings": True}, "separate input and output embeddings"),
        ({"norm": {"qk": "rmsnorm"}}, "normalizes q and k itself"),
        ({"norm": {"name": "rmsnorm"}}, "RMSNorm does not: use norm=ngpt"),
        ({"attn_softcap": 50.0}, "drop model.attn_softcap"),
        ({"norm": {"layer_placements": ["ngpt", "pre"]}}, "is a whole model: norm.layer_placements cannot mix it"),
    ],
)
def test_what_ngpt_cannot_be_is_refused_with_the_key_to_change(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_model(ngpt(**overrides))


def test_ngpt_is_its_own_model_class_and_the_plain_transformer_refuses_its_placement():
    assert type(build_model(ngpt())) is NormalizedTransformer
    assert Transformer(ngpt({"placement": "pre", "name": "rmsnorm"}, tie_embeddings=True)).post_step_hooks() == []
    with pytest.raises(ValueError, match="build it with model.build_model"):
        Transformer(ngpt())
    with pytest.raises(ValueError, match="'ngpt' is not a layer's block.*set norm.placement=ngpt"):
        Transformer(ngpt({"placement": "pre", "name": "rmsnorm", "layer_placements": ["pre", "ngpt"]}))


def test_the_attention_probes_read_ngpts_logits_with_its_softmax_scale():
    """The scores tap carries nGPT's sqrt(d_head): unit q and k scaled by s_qk = 1 give logits within sqrt(d_head)."""
    torch.manual_seed(0)
    model = build_model(ngpt())
    attention = [resolve_probe("attention")]
    metrics = run_probes(model, torch.randint(0, 97, (2, 8)), contextlib.nullcontext(), attention)
    logits = [metrics[f"attn/layers.{i}/max_logit"] for i in range(2)]
    assert all(1.0 < value <= math.sqrt(8) + 1e-5 for value in logits)  # under 1/sqrt(d) they would sit below 0.36
