"""The design space in the model: every norm type x placement x QK-norm, each placement's formula, roles."""

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, NormConfig, Transformer
from model.assembly import block_placements
from model.attention import Attention
from norms import NORM_NAMES, rms_norm


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


# Placements that take any norm type; nGPT's block, which needs its L2 norm, is tests/unit/model/test_ngpt.py's.
ANY_NORM = block_placements()  # every block takes any norm type (nGPT, a model of its own, takes its L2 norm)


@pytest.mark.parametrize("qk", [False, True], ids=["no_qk", "qk_head"])
@pytest.mark.parametrize("placement", ANY_NORM)
@pytest.mark.parametrize("norm", NORM_NAMES)
def test_every_type_placement_and_qk_norm_runs_forward_and_backward(norm, placement, qk):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(name=norm, placement=placement, qk=norm if qk else None)))
    tokens = torch.randint(0, 97, (2, 8))
    loss = model(tokens[:, :-1], tokens[:, 1:]).objective
    loss.backward()
    assert torch.isfinite(loss)
    for name, module in model.norm_modules().items():
        for param_name, param in module.named_parameters():
            assert param.grad is not None and torch.isfinite(param.grad).all(), f"{name}.{param_name}"
    qkv_normed = placement in ("hybrid", "pre_qkv")  # HybridNorm's blocks normalize q, k and v unasked
    assert any(m.role in ("q", "k") for m in model.norm_modules().values()) == (qk or qkv_normed)
    assert any(m.role == "v" for m in model.norm_modules().values()) == qkv_normed


EXPECTED_NORMS = {
    "pre": ["attn_norm", "mlp_norm"],
    "post": ["attn_out_norm", "mlp_out_norm"],
    "peri": ["attn_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm"],
    "reordered": ["attn_out_norm", "mlp_out_norm"],
    "deepnorm": ["attn_out_norm", "mlp_out_norm"],
    "hybrid": ["attn.v_norm", "mlp_norm"],
    "pre_qkv": ["attn_norm", "attn.v_norm", "mlp_norm"],
}
ROLES = {
    "v_norm": "v",
    "attn_norm": "attn_in",
    "attn_out_norm": "attn_out",
    "mlp_norm": "mlp_in",
    "mlp_out_norm": "mlp_out",
}


@pytest.mark.parametrize("placement", ANY_NORM)
def test_norm_instances_have_stable_names_and_roles(placement):
    model = Transformer(tiny(norm=NormConfig(placement=placement, qk="rmsnorm")))
    norms = model.norm_modules()
    expected = [f"layers.{i}.{n}" for i in range(2) for n in ["attn.q_norm", "attn.k_norm", *EXPECTED_NORMS[placement]]]
    expected += [] if placement in ("post", "deepnorm") else ["final_norm"]
    assert sorted(norms) == sorted(expected)
    for name, norm in norms.items():
        leaf = name.rsplit(".", 1)[-1]
        assert norm.role == {"q_norm": "q", "k_norm": "k", "final_norm": "final", **ROLES}[leaf]


def _gains(model):
    torch.manual_seed(1)
    for norm in model.norm_modules().values():
        torch.nn.init.normal_(norm.weight, 1.0, 0.3)


def _n(norm, x):
    """RMSNorm by hand, with the module's gain."""
    return rms_norm(x, norm.weight.detach(), norm.eps)


FORMULAS = {
    # Each placement written out as its formula, with the block's own branches.
    "pre": lambda b, x, att: (h := x + att(_n(b.attn_norm, x))) + b.mlp(_n(b.mlp_norm, h)),
    "post": lambda b, x, att: _n(b.mlp_out_norm, (h := _n(b.attn_out_norm, x + att(x))) + b.mlp(h)),
    "peri": lambda b, x, att: (
        (h := x + _n(b.attn_out_norm, att(_n(b.attn_norm, x)))) + _n(b.mlp_out_norm, b.mlp(_n(b.mlp_norm, h)))
    ),
    "reordered": lambda b, x, att: (h := x + _n(b.attn_out_norm, att(x))) + _n(b.mlp_out_norm, b.mlp(h)),
    # DeepNet's decoder-only alpha for 2 layers: (2 * 2) ** (1 / 4).
    "deepnorm": lambda b, x, att: _n(
        b.mlp_out_norm, 4**0.25 * (h := _n(b.attn_out_norm, 4**0.25 * x + att(x))) + b.mlp(h)
    ),
    # HybridNorm: Y = X + MHA_qkv(X), then Norm(Y) + FFN(Norm(Y)); its first block (HybridNorm*) is pre-norm.
    "hybrid": lambda b, x, att: (z := _n(b.mlp_norm, x + att(x))) + b.mlp(z),
    "pre_qkv": lambda b, x, att: (h := x + att(_n(b.attn_norm, x))) + b.mlp(_n(b.mlp_norm, h)),
}


@pytest.mark.parametrize("placement", ANY_NORM)
def test_each_placement_computes_its_formula(placement):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(placement=placement))).eval()
    _gains(model)
    block = model.layers[0]
    cos, sin = model.rope_cos[:10], model.rope_sin[:10]
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        expected = FORMULAS[placement](block, x, lambda t: block.attn(t, cos, sin))
        torch.testing.assert_close(block(x, cos, sin), expected)
        # A final norm before the head everywhere but post-norm, whose stream leaves each block normalized.
        tokens = torch.randint(0, 97, (1, 6))
        hidden = model.tok_embeddings(tokens)
        for layer in model.layers:
            hidden = layer(hidden, model.rope_cos[:6], model.rope_sin[:6])
        if placement not in ("post", "deepnorm"):
            hidden = _n(model.final_norm, hidden)
        torch.testing.assert_close(model(tokens), model.lm_head(hidden))


@pytest.mark.parametrize("axis", ["head", "all"])
def test_qk_norm_normalizes_q_and_k_before_rope(axis):
    torch.manual_seed(0)
    cfg = tiny(norm=NormConfig(qk="rmsnorm", qk_axis=axis))
    attn = Attention(cfg).eval()
    x = torch.randn(2, 6, 32)
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("q", (a[0], out)))
    attn.k_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("k", (a[0], out)))
    cos, sin = torch.ones(6, 8), torch.zeros(6, 8)  # RoPE as the identity: q and k reach SDPA as normed
    attn(x, cos, sin)
    q_in, q_out = seen["q"]
    width = 8 if axis == "head" else 4 * 8
    assert q_in.shape[-1] == width and seen["k"][0].shape[-1] == (8 if axis == "head" else 2 * 8)
    assert torch.allclose(q_out.pow(2).mean(-1), torch.ones(()), atol=1e-4)  # unit RMS over the chosen axis
    q_raw = attn.qkv_proj(x)[..., :32]
    torch.testing.assert_close(q_in.reshape(2, 6, 32), q_raw)  # straight from the projection


def test_identity_qk_norm_changes_nothing_and_cached_generation_still_agrees():
    torch.manual_seed(0)
    plain = Transformer(tiny()).eval()
    with_identity = Transformer(tiny(norm=NormConfig(qk="identity"))).eval()
    with_identity.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 97, (2, 12))
    torch.testing.assert_close(with_identity(tokens), plain(tokens))


@pytest.mark.parametrize("placement, axis", [("pre", "head"), ("reordered", "all"), ("peri", "head"), ("post", "all")])
def test_cached_generation_equals_recomputation_in_every_variant(placement, axis):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(placement=placement, qk="rmsnorm", qk_axis=axis))).eval()
    _gains(model)
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(
        model.generate(prompt, 15, temperature=0), model.generate(prompt, 15, temperature=0, use_cache=False)
    )


def test_options_per_role_as_in_the_dyt_papers_llama_setup():
    cfg = tiny(norm=NormConfig(name="dyt", **{"alpha_init": 0.2}, roles={"attn_in": {"alpha_init": 0.8}}))
    model = Transformer(cfg)
    alphas = {name: norm.alpha.item() for name, norm in model.norm_modules().items()}
    assert alphas == pytest.approx(
        {"layers.0.attn_norm": 0.8, "layers.0.mlp_norm": 0.2, "layers.1.attn_norm": 0.8, "layers.1.mlp_norm": 0.2}
        | {"final_norm": 0.2}
    )


def test_qk_norm_of_another_type_takes_only_its_own_options():
    model = Transformer(tiny(norm=NormConfig(name="dyt", **{"alpha_init": 0.3}, qk="rmsnorm")))
    assert type(model.layers[0].attn.q_norm).__name__ == "RMSNorm"
    assert model.layers[0].attn_norm.alpha.item() == pytest.approx(0.3)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(norm=dict(placement="sandwich")),
            "norm.placement must be one of pre, post, peri, reordered, .*got 'sandwich'",
        ),
        (dict(norm=dict(qk="batchnorm")), "unknown norm 'batchnorm'"),
        (dict(norm=dict(qk="rmsnorm", qk_axis="rows")), "norm.qk_axis must be one of head, all"),
        (dict(norm=dict(roles={"attention": {}})), "unknown role\\(s\\) attention; the roles are: attn_in"),
        (
            dict(norm=dict(qk="prmsnorm", roles={"q": {"k": 12}})),
            "the q norm .*k must be in \\[1, 8\\].*norm.roles.q",
        ),
        (dict(norm=dict(name="dyt", **{"alpha_init": 0.0})), "norm.alpha_init=0.0 is not allowed: it must be > 0"),
        (dict(norm=dict(name="rmsnorm", **{"alpha_init": 0.5})), "does not take option\\(s\\) alpha_init"),
        (dict(norm=dict(name="identity", **{"gain": "one_plus"})), "'identity' does not take option\\(s\\) gain"),
        (dict(norm=dict(**{"gain": "unit"})), "gain must be one of standard, one_plus, none"),
    ],
)
def test_bad_design_choices_are_refused_with_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        Transformer(tiny(**overrides))


def test_initial_weights_are_the_same_for_every_variant():
    def weights(**overrides):
        torch.manual_seed(3)
        model = Transformer(tiny(**overrides))
        return {k: v for k, v in model.state_dict().items() if "norm" not in k}

    reference = weights()
    for overrides in (
        dict(norm=NormConfig(name="dyt", placement="peri")),
        dict(norm=NormConfig(name="derf", qk="derf")),
        dict(norm=NormConfig(placement="post")),
    ):
        other = weights(**overrides)
        assert other.keys() == reference.keys() and all(torch.equal(other[k], reference[k]) for k in reference)
    # Switches that add weights (a gate, sinks) draw them after the shared ones, which stay the same.
    for overrides in (dict(attn_gate="elementwise"), dict(attn_gate="headwise", attn_sink="learned")):
        other = weights(**overrides)
        assert other.keys() > reference.keys() and all(torch.equal(other[k], reference[k]) for k in reference)


def test_pre_norm_logits_change_when_the_placement_changes():
    """The placements are not the same computation under another name."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 97, (1, 10))
    outputs = {}
    for placement in ANY_NORM:
        torch.manual_seed(0)
        outputs[placement] = Transformer(tiny(norm=NormConfig(placement=placement))).eval()(tokens)
    for a in ANY_NORM:
        for b in ANY_NORM:
            assert a == b or not torch.allclose(outputs[a], outputs[b]), (a, b)
    assert F.softmax(outputs["pre"], -1).sum(-1).allclose(torch.ones(1, 10))
