"""Attention's third-part switches by hand: QKV-norm, SimpleNorm's norms after each linear layer, the output gate,
learned sinks, and HybridNorm* as a mix of blocks."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import ModelConfig, NormConfig, Transformer
from model.assembly import chosen_variants, combined
from model.attention import Attention
from model.mlp import SwiGLU
from norms import rms_norm
from variants.attention_sinks import SinkAttention
from variants.gated_attention import GatedAttention
from variants.hybridnorm import HybridBlock, PreQKVNormBlock
from variants.simplenorm import SimpleNormAttention, SimpleNormSwiGLU

D, HEADS, KV, HEAD_DIM, SEQ = 32, 4, 2, 8, 6


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=D, n_layers=3, n_heads=HEADS, n_kv_heads=KV, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def attention(cfg: ModelConfig) -> Attention:
    """The attention the model builds for ``cfg``: Attention with the chosen variants' parts (model/registry.py)."""
    return combined(Attention, chosen_variants(cfg), "ATTENTION")(cfg)


def swiglu(cfg: ModelConfig) -> SwiGLU:
    return combined(SwiGLU, chosen_variants(cfg), "MLP")(cfg)


def _no_rope():
    return torch.ones(SEQ, HEAD_DIM), torch.zeros(SEQ, HEAD_DIM)  # RoPE as the identity


def _random_gains(module):
    torch.manual_seed(1)
    for name, param in module.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.normal_(param, 1.0, 0.3)


def _by_hand(q, k, v, sink=None):
    """softmax(q k^T / sqrt(d)) v per head, causal, each key/value head serving two query heads; heads
    (batch, seq, heads, dim) in, (batch, seq, heads, dim) out."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(HEADS // KV, 1), v.repeat_interleave(HEADS // KV, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(~torch.ones(SEQ, SEQ, dtype=torch.bool).tril(), float("-inf"))
    exp = scores.exp()
    denominator = exp.sum(-1, keepdim=True) + (0 if sink is None else sink.exp().view(1, -1, 1, 1))
    return ((exp / denominator) @ v).transpose(1, 2)


def _split(attn, x):
    q, k, v = attn.qkv_proj(x).split([HEADS * HEAD_DIM, KV * HEAD_DIM, KV * HEAD_DIM], -1)
    return q.view(2, SEQ, HEADS, HEAD_DIM), k.view(2, SEQ, KV, HEAD_DIM), v.view(2, SEQ, KV, HEAD_DIM)


@pytest.mark.parametrize("axis", ["head", "all"])
def test_qkv_norm_normalizes_v_too(axis):
    torch.manual_seed(0)
    attn = Attention(tiny(norm=NormConfig(qk="rmsnorm", v="rmsnorm", qk_axis=axis))).eval()
    _random_gains(attn)
    x = torch.randn(2, SEQ, D)
    q, k, v = _split(attn, x)
    normed = []
    for t, norm, heads in ((q, attn.q_norm, HEADS), (k, attn.k_norm, KV), (v, attn.v_norm, KV)):
        flat = t if axis == "head" else t.reshape(2, SEQ, heads * HEAD_DIM)
        normed.append(rms_norm(flat, norm.weight.detach(), norm.eps).view(2, SEQ, heads, HEAD_DIM))
    expected = attn.o_proj(_by_hand(*normed).reshape(2, SEQ, D))
    torch.testing.assert_close(attn(x, *_no_rope()), expected)


def test_simplenorm_normalizes_every_projections_output():
    torch.manual_seed(0)
    cfg = tiny(norm=NormConfig(after_linear="rmsnorm"))
    attn, mlp = attention(cfg).eval(), swiglu(cfg)
    assert isinstance(attn, SimpleNormAttention) and isinstance(mlp, SimpleNormSwiGLU)
    _random_gains(attn), _random_gains(mlp)
    x = torch.randn(2, SEQ, D)

    def n(norm, t):
        return rms_norm(t, norm.weight.detach(), norm.eps)

    q, k, v = attn.qkv_proj(x).split([HEADS * HEAD_DIM, KV * HEAD_DIM, KV * HEAD_DIM], -1)
    q, k, v = n(attn.q_proj_norm, q), n(attn.k_proj_norm, k), n(attn.v_proj_norm, v)
    heads = [t.view(2, SEQ, -1, HEAD_DIM) for t in (q, k, v)]
    expected = n(attn.o_proj_norm, attn.o_proj(_by_hand(*heads).reshape(2, SEQ, D)))
    torch.testing.assert_close(attn(x, *_no_rope()), expected)

    gate, up = mlp.gate_up_proj(x).chunk(2, -1)
    expected = n(mlp.down_proj_norm, mlp.down_proj(F.silu(n(mlp.gate_proj_norm, gate)) * n(mlp.up_proj_norm, up)))
    torch.testing.assert_close(mlp(x), expected)


def test_simplenorm_norms_have_roles_and_stable_names():
    model = Transformer(tiny(norm=NormConfig(after_linear="rmsnorm")))
    roles = {name: norm.role for name, norm in model.norm_modules().items() if name.startswith("layers.0.")}
    assert roles == {
        "layers.0.attn_norm": "attn_in",
        "layers.0.attn.q_proj_norm": "q_proj",
        "layers.0.attn.k_proj_norm": "k_proj",
        "layers.0.attn.v_proj_norm": "v_proj",
        "layers.0.attn.o_proj_norm": "o_proj",
        "layers.0.mlp_norm": "mlp_in",
        "layers.0.mlp.gate_proj_norm": "gate_proj",
        "layers.0.mlp.up_proj_norm": "up_proj",
        "layers.0.mlp.down_proj_norm": "down_proj",
    }


class _Constant(nn.Module):
    def __init__(self, value: float, width: int) -> None:
        super().__init__()
        self.value, self.width = value, width

    def forward(self, x):
        return torch.full((*x.shape[:-1], self.width), self.value)


@pytest.mark.parametrize("kind, width", [("headwise", HEADS), ("elementwise", HEADS * HEAD_DIM)])
def test_the_output_gate_multiplies_each_head_by_a_sigmoid_of_the_input(kind, width):
    torch.manual_seed(0)
    gated = attention(tiny(attn_gate=kind)).eval()
    assert isinstance(gated, GatedAttention)
    plain = Attention(tiny()).eval()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate_proj")})
    x = torch.randn(2, SEQ, D)
    heads = _by_hand(*_split(gated, x))  # (batch, seq, heads, dim)
    gate = torch.sigmoid(x @ gated.gate_proj.weight.T).view(2, SEQ, HEADS, -1)  # one per head, or per feature
    torch.testing.assert_close(gated(x, *_no_rope()), gated.o_proj((heads * gate).reshape(2, SEQ, D)))
    gated.gate_proj = _Constant(1e4, width)  # sigmoid(1e4) is 1.0 in float32: a gate of all ones
    torch.testing.assert_close(gated(x, *_no_rope()), plain(x, *_no_rope()))


def test_a_learned_sink_joins_the_softmax_denominator():
    torch.manual_seed(0)
    sunk = attention(tiny(attn_sink="learned")).eval()
    assert isinstance(sunk, SinkAttention)
    plain = Attention(tiny()).eval()
    plain.load_state_dict({k: v for k, v in sunk.state_dict().items() if k != "sink_logits"})
    x = torch.randn(2, SEQ, D)
    with torch.no_grad():
        sunk.sink_logits.copy_(torch.tensor([-1.0, 0.0, 1.0, 3.0]))
    expected = sunk.o_proj(_by_hand(*_split(sunk, x), sink=sunk.sink_logits.detach()).reshape(2, SEQ, D))
    torch.testing.assert_close(sunk(x, *_no_rope()), expected)
    with torch.no_grad():
        sunk.sink_logits.fill_(float("-inf"))  # exp(-inf) = 0: plain softmax
    torch.testing.assert_close(sunk(x, *_no_rope()), plain(x, *_no_rope()))


@pytest.mark.parametrize(
    "switch", [dict(attn_sink="learned"), dict(attn_gate="headwise"), dict(norm=NormConfig(v="rmsnorm"))]
)
def test_cached_generation_equals_recomputation(switch):
    torch.manual_seed(0)
    model = Transformer(tiny(**switch)).eval()
    prompt = torch.randint(0, 97, (2, 5))
    assert torch.equal(
        model.generate(prompt, 10, temperature=0), model.generate(prompt, 10, temperature=0, use_cache=False)
    )


def test_hybrid_star_is_pre_norm_with_qkv_norm_first_and_hybridnorm_after():
    model = Transformer(tiny(norm=NormConfig(placement="hybrid_star")))
    assert [type(layer) for layer in model.layers] == [PreQKVNormBlock, HybridBlock, HybridBlock]
    assert model.final_norm is not None  # HybridNorm's stream leaves each block with an MLP added after its norm


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(norm=NormConfig(after_linear="rmsnorm", placement="peri")), "PeriNormBlock normalizes again"),
        (dict(norm=NormConfig(after_linear="rmsnorm", placement="hybrid")), "HybridBlock normalizes again"),
        (dict(norm=NormConfig(after_linear="rmsnorm", qk="rmsnorm")), "norm.after_linear normalizes q, k and v"),
        (dict(attn_gate="sigmoid"), "model.attn_gate must be one of none, headwise, elementwise"),
        (dict(attn_sink="fixed"), "model.attn_sink must be one of none, learned"),
        (
            dict(tie_embeddings=False, attn_sink="learned", norm=NormConfig(name="l2norm", placement="ngpt")),
            "has no model.attn_sink",
        ),
    ],
)
def test_combinations_the_papers_do_not_define_are_refused_with_the_fix(overrides, message):
    from model import build_model

    with pytest.raises(ValueError, match=message):
        build_model(tiny(**overrides))
