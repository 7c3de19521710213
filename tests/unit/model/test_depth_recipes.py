"""LayerNorm Scaling, Mix-LN and DeepNorm; the embedding scales and independent weight decay: each by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from model import ModelConfig, NormConfig, Transformer
from model.assembly import assemble, chosen_variants, combined
from model.blocks import PostNormBlock, PreNormBlock
from training.step.optim import build_optimizer, lr_at
from variants.deepnorm import DeepNormBlock
from variants.mix_ln import mix_ln
from variants.op_block import ScaledBranches


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def test_layernorm_scaling_multiplies_each_layers_norm_outputs_by_one_over_sqrt_l():
    torch.manual_seed(0)
    scaled = Transformer(tiny(norm=NormConfig(depth_scaling="inverse_sqrt")))
    torch.manual_seed(0)
    plain = Transformer(tiny())
    x = torch.randn(2, 5, 32)
    for layer, (a, b) in enumerate(zip(scaled.layers, plain.layers), 1):
        for name in ("attn_norm", "mlp_norm"):
            assert getattr(a, name).output_scale == pytest.approx(1 / math.sqrt(layer))
            torch.testing.assert_close(getattr(a, name)(x), getattr(b, name)(x) / math.sqrt(layer))
            normalized, total = getattr(a, name)(x, residual=x)
            torch.testing.assert_close(normalized, getattr(b, name)(2 * x) / math.sqrt(layer))
            torch.testing.assert_close(total, 2 * x)  # the residual stream itself is not scaled
    assert scaled.final_norm.output_scale == 1.0  # the final norm belongs to no layer
    assert [m.attn_norm.output_scale for m in scaled.layers] == pytest.approx([1, 2**-0.5, 3**-0.5, 0.5])


def test_the_paper_notes_a_depth_scaled_init_cancels_it_so_init_out_scale_can_be_none():
    torch.manual_seed(0)
    scaled = Transformer(tiny())
    torch.manual_seed(0)
    unscaled = Transformer(tiny(init_out_scale="none"))
    for a, b in zip(scaled.layers, unscaled.layers):
        torch.testing.assert_close(a.attn.o_proj.weight * math.sqrt(8), b.attn.o_proj.weight)
        torch.testing.assert_close(a.mlp.down_proj.weight * math.sqrt(8), b.mlp.down_proj.weight)
        assert torch.equal(a.attn.qkv_proj.weight, b.attn.qkv_proj.weight)


def test_mix_ln_puts_post_norm_in_the_first_layers_and_pre_norm_after():
    model = Transformer(tiny(n_layers=8, norm=NormConfig(placement="mix_ln", post_fraction=0.25)))
    assert [type(layer) for layer in model.layers] == [PostNormBlock] * 2 + [PreNormBlock] * 6
    assert model.final_norm is not None  # the last block is pre-norm
    assert mix_ln(tiny(norm=NormConfig(placement="mix_ln", post_fraction=0.5))) == ["post", "post", "pre", "pre"]
    assert mix_ln(tiny(norm=NormConfig(placement="mix_ln", post_fraction=0.3))) == [
        "post",
        "pre",
        "pre",
        "pre",
    ]  # floor
    assert (
        assemble(tiny(norm=NormConfig(placement="mix_ln", post_fraction=0.5))).blocks
        == (PostNormBlock,) * 2 + (PreNormBlock,) * 2
    )
    assert (
        assemble(tiny(norm=NormConfig(placement="mix_ln", post_fraction=0.3))).blocks
        == (PostNormBlock,) + (PreNormBlock,) * 3
    )
    all_post = Transformer(tiny(norm=NormConfig(placement="mix_ln", post_fraction=1.0)))
    assert all(isinstance(layer, PostNormBlock) for layer in all_post.layers) and all_post.final_norm is None


def test_mix_ln_with_no_post_layers_is_pre_norm_bit_for_bit():
    tokens = torch.randint(0, 97, (2, 10))
    torch.manual_seed(0)
    mix = Transformer(tiny(norm=NormConfig(placement="mix_ln", post_fraction=0.0)))
    torch.manual_seed(0)
    pre = Transformer(tiny())
    assert mix.state_dict().keys() == pre.state_dict().keys()
    assert all(torch.equal(mix.state_dict()[k], pre.state_dict()[k]) for k in pre.state_dict())
    assert torch.equal(mix(tokens), pre(tokens))
    assert torch.equal(mix(tokens[:, :-1], tokens[:, 1:]).objective, pre(tokens[:, :-1], tokens[:, 1:]).objective)


def test_a_per_layer_placement_list_is_a_general_mix():
    model = Transformer(tiny(norm=NormConfig(layer_placements=["pre", "peri", "post", "reordered"])))
    assert [type(layer).__name__ for layer in model.layers] == [
        "PreNormBlock", "PeriNormBlock", "PostNormBlock", "ReorderedBlock"
    ]  # fmt: skip
    assert model.final_norm is not None  # reordered wants one
    with pytest.raises(ValueError, match="norm.layer_placements has 3 entries for model.n_layers=4"):
        tiny(norm=NormConfig(layer_placements=["pre", "pre", "post"]))
    with pytest.raises(ValueError, match="'side' is not a layer's block; each layer takes one of: pre, post, peri"):
        Transformer(tiny(norm=NormConfig(layer_placements=["pre", "pre", "side", "pre"])))
    blocks = "pre, post, peri, reordered, deepnorm, hybrid, pre_qkv"  # only what a layer can take, not hybrid_star
    with pytest.raises(ValueError) as refused:
        Transformer(tiny(norm=NormConfig(layer_placements=["pre", "hybrid_star", "pre", "pre"])))
    assert str(refused.value) == (
        f"norm.layer_placements: 'hybrid_star' is not a layer's block; each layer takes one of: {blocks} "
        "(hybrid_star places the whole model: set norm.placement=hybrid_star)"
    )


def test_deepnorm_alpha_beta_and_init_against_the_papers_decoder_constants():
    torch.manual_seed(0)
    deep = Transformer(tiny(norm=NormConfig(placement="deepnorm")))
    torch.manual_seed(0)
    pre = Transformer(tiny())
    L = 4
    alpha, beta = (2 * L) ** 0.25, (8 * L) ** -0.25
    assert all(isinstance(layer, DeepNormBlock) for layer in deep.layers) and deep.final_norm is None
    assert deep.layers[0].alpha == pytest.approx(alpha) and deep.layers[0].beta == pytest.approx(beta)
    xavier = lambda fan_out, fan_in: math.sqrt(2 / (fan_in + fan_out))  # noqa: E731
    hidden, std, out_scale = pre.layers[0].mlp.down_proj.in_features, 0.02, 1 / math.sqrt(2 * L)
    for d, p in zip(deep.layers, pre.layers):
        # DeepNet's Figure 2: Xavier-normal per logical matrix, gain 1 for q (32 x 32) and k (16 x 32),
        # beta for v (16 x 32), the output (32 x 32) and the MLP (gate, up: hidden x 32; down: 32 x hidden),
        # made from the same draws as pre-norm's (N(0, 0.02), output projections N(0, 0.02 / sqrt(2L))).
        q, k, v = d.attn.qkv_proj.weight.split([32, 16, 16])
        pq, pk, pv = p.attn.qkv_proj.weight.split([32, 16, 16])
        torch.testing.assert_close(q, pq * xavier(32, 32) / std)
        torch.testing.assert_close(k, pk * xavier(16, 32) / std)
        torch.testing.assert_close(v, pv * beta * xavier(16, 32) / std)
        torch.testing.assert_close(
            d.mlp.gate_up_proj.weight, p.mlp.gate_up_proj.weight * beta * xavier(hidden, 32) / std
        )
        torch.testing.assert_close(
            d.attn.o_proj.weight, p.attn.o_proj.weight * beta * xavier(32, 32) / (std * out_scale)
        )
        torch.testing.assert_close(
            d.mlp.down_proj.weight, p.mlp.down_proj.weight * beta * xavier(32, hidden) / (std * out_scale)
        )
    torch.manual_seed(0)
    wide = Transformer(tiny(d_model=256, n_heads=8, n_kv_heads=8, norm=NormConfig(placement="deepnorm"))).layers[0]
    assert wide.attn.o_proj.weight.std().item() == pytest.approx(beta / math.sqrt(256), rel=0.02)  # the std itself


@pytest.mark.parametrize("embed_scale", ["sqrt_d", "learned"])
def test_embedding_scales(embed_scale):
    torch.manual_seed(0)
    model = Transformer(tiny(embed_scale=embed_scale))
    tokens = torch.randint(0, 97, (2, 6))
    torch.testing.assert_close(model.embed(tokens), model.tok_embeddings(tokens) * math.sqrt(32))
    if embed_scale == "learned":
        assert model.embed_scale.requires_grad and model.embed_scale.item() == pytest.approx(math.sqrt(32))
        model(tokens[:, :-1], tokens[:, 1:]).objective.backward()
        assert model.embed_scale.grad is not None and model.embed_scale.grad != 0
        # A scalar: never decayed, like the norms' parameters.
        cfg = SimpleNamespace(optimizer="adamw", weight_decay=0.1, weight_decay_mode="coupled", decay_norms_and_embeddings=False,
                              lr=1e-3, beta1=0.9, beta2=0.95)  # fmt: skip
        decayed = build_optimizer(model, cfg, torch.device("cpu")).param_groups[0]["params"]
        assert all(p is not model.embed_scale for p in decayed)
    else:
        assert not any("embed_scale" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize("mode", ["coupled", "independent"])
def test_weight_decay_update_by_hand(mode):
    """With zero gradients Adam moves nothing, so one step is the decay alone:
    coupled theta * (1 - lr(t) * lambda); independent theta * (1 - lambda * s(t)), s(t) = lr(t) / lr."""
    torch.manual_seed(0)
    model = Transformer(tiny(n_layers=1))
    cfg = SimpleNamespace(optimizer="adamw", weight_decay=1e-2, weight_decay_mode=mode, decay_norms_and_embeddings=False, lr=3e-2,
                          beta1=0.9, beta2=0.95, warmup_steps=10, max_steps=100, min_lr_ratio=0.1)  # fmt: skip
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    step = 4  # in the warmup: s(t) = 0.5
    lr = lr_at(step, cfg)
    schedule = lr / cfg.lr
    assert schedule == pytest.approx(0.5)
    for group in optimizer.param_groups:
        group["lr"] = lr
    weight = model.layers[0].attn.qkv_proj.weight
    before = weight.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    shrink = cfg.weight_decay * schedule if mode == "independent" else lr * cfg.weight_decay
    torch.testing.assert_close(weight.detach(), before * (1 - shrink), rtol=1e-6, atol=0)
    # Independent: the learning rate no longer sets the decay; at ten times the rate, the same shrink.
    faster = SimpleNamespace(**{**vars(cfg), "lr": 10 * cfg.lr})
    group = build_optimizer(model, faster, torch.device("cpu")).param_groups[0]
    faster_shrink = lr_at(step, faster) * group["weight_decay"]
    assert faster_shrink == pytest.approx(shrink if mode == "independent" else 10 * shrink)


def test_the_op_block_has_norms_only_at_both_ends_and_on_q_and_k():
    model = Transformer(
        tiny(residual_scale=0.2, outer_norm="layernorm", norm=NormConfig(name="identity", qk="rmsnorm"))
    )
    kinds = {name: type(norm).__name__ for name, norm in model.norm_modules().items()}
    assert kinds["embed_norm"] == kinds["final_norm"] == "LayerNorm"
    assert {kinds[f"layers.{i}.attn.{qk}_norm"] for i in range(4) for qk in "qk"} == {"RMSNorm"}
    assert {kinds[f"layers.{i}.{role}"] for i in range(4) for role in ("attn_norm", "mlp_norm")} == {"Identity"}
    tokens = torch.randint(0, 97, (2, 5))
    raw, embedded = model.tok_embeddings(tokens), model.embed(tokens)  # zero mean, unit variance per token
    torch.testing.assert_close(embedded.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    eps = model.embed_norm.eps  # the embeddings' std is 0.02, so eps shows: var = s^2 / (s^2 + eps)
    expected = raw.var(-1, unbiased=False) / (raw.var(-1, unbiased=False) + eps)
    torch.testing.assert_close(embedded.var(-1, unbiased=False), expected, atol=1e-4, rtol=0)


def test_residual_scale_multiplies_each_branch_output_not_the_stream():
    torch.manual_seed(0)
    cfg = tiny(residual_scale=0.2)
    block = combined(PreNormBlock, chosen_variants(cfg), "BLOCK")(cfg, 0)  # the block the model builds
    assert isinstance(block, PreNormBlock) and isinstance(block, ScaledBranches)
    x = torch.randn(2, 5, 32)
    cos, sin = Transformer(tiny()).rope_cos[:5], Transformer(tiny()).rope_sin[:5]
    h = x + 0.2 * block.attn(block.attn_norm(x), cos, sin, None, 0)
    expected = h + 0.2 * block.mlp(block.mlp_norm(h))
    torch.testing.assert_close(block(x, cos, sin), expected)
    with pytest.raises(ValueError, match=r"model.residual_scale=0.0 is not allowed: it must be > 0 or null"):
        tiny(residual_scale=0.0)
