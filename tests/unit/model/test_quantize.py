"""The quantization schemes against values worked out by hand, and what quantizing may not touch."""

import pytest
import torch
from torch import nn

from model import ModelConfig, Transformer
from model.quantize import SCHEMES, QuantizationError, block_linears, quantized, round_to_fp8, round_to_int

# No value lands on a half step, where float rounding of x / scale would decide the hand calculation.
W = torch.tensor([[1.0, -2.2, 0.5, 4.0], [0.0, 0.0, 0.0, 0.0]])


def test_int8_per_output_channel_by_hand():
    # row 0: scale 4/127; 1, -2.2, 0.5, 4 -> 31.75, -69.85, 15.875, 127 -> 32, -70, 16, 127
    expected = torch.tensor([[32.0, -70.0, 16.0, 127.0], [0.0, 0.0, 0.0, 0.0]]) * 4 / 127
    torch.testing.assert_close(SCHEMES["w8a8"].weights(W), expected)
    assert torch.equal(SCHEMES["w8a8"].weights(W)[1], torch.zeros(4))  # an all-zero row stays zero, no NaN


def test_int4_per_output_channel_by_hand():
    # scale 4/7: 1.75, -3.85, 0.875, 7 -> 2, -4, 1, 7
    expected = torch.tensor([[2.0, -4.0, 1.0, 7.0], [0.0, 0.0, 0.0, 0.0]]) * 4 / 7
    torch.testing.assert_close(SCHEMES["w4a16"].weights(W), expected)
    assert SCHEMES["w4a16"].inputs is None  # activations stay in float


def test_a_huge_value_in_a_row_rounds_the_rest_of_it_to_zero():
    row = torch.tensor([[1000.0, 1.0, -1.0, 0.5]])  # scale 1000/127 = 7.9: the small values are < half a step
    torch.testing.assert_close(round_to_int(row, 127, 1), torch.tensor([[1000.0, 0.0, 0.0, 0.0]]))


def test_fp8_scales_each_row_to_448_and_rounds_to_three_mantissa_bits():
    exact = torch.tensor([[1.0, -2.0, 0.5, 4.0]])
    # scale 4/448 = 1/112: 1, -2, 0.5, 4 -> 112, -224, 56, 448, all exact in e4m3 (1.75 * 2^k)
    torch.testing.assert_close(SCHEMES["fp8"].weights(exact), exact)
    # 1.1 -> 123.2, between e4m3's neighbours 120 and 128 -> 120 -> 120/112
    torch.testing.assert_close(round_to_fp8(torch.tensor([[4.0, 1.1, 0.0, 0.0]]), 1)[0, 1], torch.tensor(120 / 112))


def test_activations_per_token_and_per_tensor_by_hand():
    x = torch.tensor([[1.0, 2.2, 3.0, 4.0], [100.0, 0.0, 0.0, 0.0]])
    per_token = SCHEMES["w8a8"].inputs(x)
    # token 0 on its own scale 4/127: 31.75, 69.85, 95.25, 127 -> 32, 70, 95, 127
    torch.testing.assert_close(per_token[0], torch.tensor([32.0, 70.0, 95.0, 127.0]) * 4 / 127)
    torch.testing.assert_close(per_token[1], x[1])
    per_tensor = SCHEMES["w8a8_tensor"].inputs(x)
    # one scale 100/127 for both tokens: 1.27, 2.794, 3.81, 5.08 -> 1, 3, 4, 5: token 0 loses its detail
    torch.testing.assert_close(per_tensor[0], torch.tensor([1.0, 3.0, 4.0, 5.0]) * 100 / 127)
    fp8 = SCHEMES["fp8"].inputs(x)
    torch.testing.assert_close(fp8[1], x[1])  # 100 scales to 448 exactly


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=16)
    return Transformer(cfg).eval()


def test_quantized_copy_rounds_block_linears_and_their_inputs_and_leaves_the_rest():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantized(model, "w8a8")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is untouched
    names = set(block_linears(q))
    assert {"layers.0.attn.qkv_proj", "layers.0.attn.o_proj", "layers.1.mlp.down_proj"} <= names
    assert not any(n.startswith(("tok_embeddings", "lm_head")) for n in names)
    torch.testing.assert_close(q.lm_head.weight, model.lm_head.weight)  # embeddings and head stay in float
    linear, original = q.layers[0].mlp.down_proj, model.layers[0].mlp.down_proj
    torch.testing.assert_close(linear.weight, round_to_int(original.weight, 127, 1))
    x = torch.randn(3, original.in_features)
    expected = nn.functional.linear(round_to_int(x, 127, -1), round_to_int(original.weight, 127, 1))
    torch.testing.assert_close(linear(x), expected)


def test_every_scheme_changes_the_output_a_little():
    model, tokens = _model(), torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        reference = model(tokens)
        for scheme in SCHEMES:
            out = quantized(model, scheme)(tokens)
            assert 0 < (out - reference).abs().max() < 0.5 * reference.abs().max(), scheme


def test_unknown_scheme_names_the_schemes():
    with pytest.raises(QuantizationError, match="unknown quantization scheme 'int3'.*w8a8, w8a8_tensor, w4a16, fp8"):
        quantized(_model(), "int3")


def test_a_layer_the_schemes_cannot_handle_is_named():
    model = _model()
    model.layers[1].mlp.register_parameter("mixer", nn.Parameter(torch.ones(4, 4)))
    with pytest.raises(QuantizationError, match=r"layers\.1\.mlp\.mixer is a matrix outside an nn\.Linear"):
        quantized(model, "w4a16")
    model = _model()
    with torch.no_grad():
        model.layers[0].attn.o_proj.weight[0, 0] = float("nan")
    with pytest.raises(QuantizationError, match=r"layers\.0\.attn\.o_proj has non-finite weights"):
        quantized(model, "fp8")
