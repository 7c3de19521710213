"""Norm gains folded into the linear layers after them (model/fold.py): the same logits, or a refusal naming the norm."""

from itertools import product

import pytest
import torch

from model import ModelConfig, NormConfig, Transformer
from model.fold import fold_gains
from norms.base import GAINS
from norms.registry import NORM_NAMES, norm_options


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def _trained_looking(model: Transformer) -> Transformer:
    """Gains and output scales away from their initial values, as training leaves them."""
    torch.manual_seed(1)
    with torch.no_grad():
        for norm in model.norm_modules().values():
            if norm.weight is not None:
                norm.weight.normal_(0.0 if getattr(norm, "zero_centered", False) else 1.0, 0.3)
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(norm=NormConfig(name="layernorm", **{"bias": False})),
        dict(norm=NormConfig(name="prmsnorm", **{"p": 0.25})),
        dict(tie_embeddings=False, norm=NormConfig(**{"gain": "one_plus"})),
        dict(attn_gate="elementwise", norm=NormConfig(depth_scaling="inverse_sqrt", v="rmsnorm", qk_axis="all")),
        dict(attn_sink="learned", norm=NormConfig(v="rmsnorm", placement="mix_ln", post_fraction=0.0)),
    ],
    ids=["rmsnorm", "layernorm-no-bias", "prmsnorm", "one_plus-untied", "lns-v_all-gate", "v_head-sink"],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_folded_logits_equal_the_unfolded_ones(overrides, dtype):
    torch.manual_seed(0)
    model = _trained_looking(Transformer(tiny(**overrides))).to(dtype).eval()
    tokens = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        before = model(tokens)
        folded = fold_gains(model)
        after = model(tokens)
    assert folded and all(model.norm_modules()[name].effective_gain() is None for name in folded)
    assert model.lm_head.weight is not model.tok_embeddings.weight  # the head took the final gain alone
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(after, before, atol=tolerance, rtol=tolerance)


def _every_norm_gain_and_bias():
    """Every registered norm, with each gain parametrization and bias it accepts."""
    for name in NORM_NAMES:
        accepts = norm_options(name)
        gains, biases = GAINS if "gain" in accepts else [None], [False, True] if "bias" in accepts else [None]
        for gain, bias in product(gains, biases):
            options = {key: value for key, value in (("gain", gain), ("bias", bias)) if value is not None}
            yield pytest.param(name, options, id="-".join([name, *(f"{k}={v}" for k, v in options.items())]))


@pytest.mark.parametrize("name, options", list(_every_norm_gain_and_bias()))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # float32 on CPU: the C kernels' path
def test_folding_any_norm_with_random_gains_keeps_the_logits(name, options, dtype):
    """The property behind fold_gains, over the registry: the same logits to float rounding, or a refusal naming
    the bias when a gain is followed by one (and the logits unchanged)."""
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(name=name, **options))).to(dtype).eval()
    with torch.no_grad():
        for norm in model.norm_modules().values():
            for parameter in norm.parameters():  # gains, and alpha, shift and bias where the norm has them
                parameter.add_(0.3 * torch.randn_like(parameter))
    tokens = torch.randint(0, 97, (2, 12))
    has_gain = model.norm_modules()["final_norm"].effective_gain() is not None
    with torch.no_grad():
        before = model(tokens)
        if options.get("bias") and has_gain:
            with pytest.raises(ValueError, match=r"cannot fold layers\.0\.attn_norm's gain: \w+ adds a bias after it"):
                fold_gains(model)
            folded = []
        else:
            folded = fold_gains(model)
            assert bool(folded) == has_gain
        after = model(tokens)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(after, before, atol=tolerance, rtol=tolerance)
    for folded_name in folded:  # the gain is gone (or, where a kernel needs a weight, ones)
        gain = model.norm_modules()[folded_name].effective_gain()
        assert gain is None or torch.equal(gain, torch.ones_like(gain))


def test_the_default_model_folds_within_1e4_in_float32():
    torch.manual_seed(0)
    model = _trained_looking(Transformer(ModelConfig())).eval()
    tokens = torch.randint(0, 4096, (2, 64))
    with torch.no_grad():
        before = model(tokens)
        fold_gains(model)
        assert (model(tokens) - before).abs().max().item() < 1e-4


@pytest.mark.parametrize(
    "overrides, blocker",
    [
        (
            dict(norm=NormConfig(placement="post")),
            "cannot fold layers.0.attn_out_norm's gain: its output joins the residual stream",
        ),
        (dict(norm=NormConfig(placement="peri")), "cannot fold layers.0.attn_out_norm's gain"),
        (dict(norm=NormConfig(placement="hybrid")), "cannot fold layers.0.attn.q_norm's gain: q and k go through RoPE"),
        (dict(norm=NormConfig(qk="rmsnorm")), "cannot fold layers.0.attn.q_norm's gain: q and k go through RoPE"),
        (
            dict(norm=NormConfig(name="layernorm")),
            "cannot fold layers.0.attn_norm's gain: LayerNorm adds a bias after it",
        ),
        (dict(norm=NormConfig(name="dyt")), "cannot fold layers.0.attn_norm's gain: DyT adds a bias after it"),
        (dict(norm=NormConfig(after_linear="rmsnorm")), "cannot fold layers.0.attn.q_proj_norm's gain"),
    ],
)
def test_a_gain_that_cannot_fold_is_named_and_nothing_changes(overrides, blocker):
    model = _trained_looking(Transformer(tiny(**overrides)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=blocker):
        fold_gains(model)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_a_constant_output_scale_without_a_gain_folds_too():
    """LayerNorm Scaling on a norm with no gain (here the MLP's input norms) leaves only N(x)/sqrt(l) to fold."""
    torch.manual_seed(0)
    cfg = tiny(norm=NormConfig(depth_scaling="inverse_sqrt", roles={"mlp_in": {"gain": "none"}}))
    model = _trained_looking(Transformer(cfg)).double().eval()
    tokens = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        before = model(tokens)
        assert "layers.1.mlp_norm" in fold_gains(model)
        torch.testing.assert_close(model(tokens), before, atol=1e-12, rtol=1e-12)
    assert all(norm.output_scale == 1.0 for norm in model.norm_modules().values())


def test_the_embedding_norm_is_named_when_it_cannot_fold():
    model = Transformer(tiny(outer_norm="rmsnorm", norm=NormConfig(name="identity")))
    with pytest.raises(ValueError, match="cannot fold embed_norm's gain: its output joins the residual stream"):
        fold_gains(model)
