"""The probe pass: statistics that mean the same thing in every placement, attention and outlier features."""

import contextlib
import math

import pytest
import torch

from model import ModelConfig, Transformer
from model.attention import masked_scores
from training.probes import feature_kurtosis, run_probes
from training.probes.attention import attention_stats
from training.probes.attention_sinks import sink_stats
from training.probes.layer_importance import SkippedBlock, angular_distance, skip_deltas, skipping
from training.probes.massive import massive_stats


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def test_feature_kurtosis_is_about_3_for_gaussian_and_large_with_an_outlier_feature():
    torch.manual_seed(0)
    x = torch.randn(8, 512, 256)
    assert feature_kurtosis(x) == pytest.approx(3.0, abs=0.5)
    x[..., 17] *= 100
    assert feature_kurtosis(x) > 100


def test_attention_stats_by_hand():
    # One head, head_dim 1, two positions: logits are q_i * k_j (scale 1/sqrt(1) = 1), causal.
    q = torch.tensor([2.0, 1.0]).view(1, 1, 2, 1)
    k = torch.tensor([1.0, 3.0]).view(1, 1, 2, 1)
    stats = attention_stats(masked_scores(q, k, 0))  # causal: [[True, False], [True, True]]
    assert stats["max_logit"] == pytest.approx(3.0)  # q_1 * k_1; the masked 2 * 3 = 6 does not count
    p = torch.softmax(torch.tensor([1.0, 3.0]), 0)
    second = -(p * p.log()).sum().item()
    assert stats["entropy"] == pytest.approx((0.0 + second) / 2)  # the first row attends to itself only


def _probe(model, tokens):
    return run_probes(model, tokens, contextlib.nullcontext())


def _rms(t):
    return t.double().pow(2).mean().sqrt().item()


@pytest.mark.parametrize("placement", ["pre", "post", "peri", "reordered"])
def test_norm_statistics_describe_what_each_norm_sees_in_every_placement(placement):
    torch.manual_seed(0)
    model = Transformer(tiny(placement=placement)).eval()
    tokens = torch.randint(0, 97, (2, 12))
    metrics = _probe(model, tokens)
    block = model.layers[0]
    cos, sin = model.rope_cos[:12], model.rope_sin[:12]
    with torch.no_grad():
        x = model.tok_embeddings(tokens)
        out = block(x, cos, sin)
        if placement in ("pre", "peri"):  # the norm before attention sees the residual stream
            assert metrics["act/layers.0.attn_norm/in_rms"] == pytest.approx(_rms(x))
        if placement == "post":  # the norm after attention sees the stream plus the branch
            assert metrics["act/layers.0.attn_out_norm/in_rms"] == pytest.approx(_rms(x + block.attn(x, cos, sin)))
        if placement == "reordered":  # the norm after attention sees the branch alone
            assert metrics["act/layers.0.attn_out_norm/in_rms"] == pytest.approx(_rms(block.attn(x, cos, sin)))
    assert metrics["act/layers.0/stream_rms"] == pytest.approx(_rms(out))
    assert math.isfinite(metrics["attn/layers.1/max_logit"]) and metrics["attn/layers.1/entropy"] > 0


def test_probe_leaves_the_model_as_it_was():
    model = Transformer(tiny(qk_norm="rmsnorm"))
    tokens = torch.randint(0, 97, (1, 8))
    before = model(tokens)
    _probe(model, tokens)
    assert model.training
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    torch.testing.assert_close(model(tokens), before)


def test_qk_norm_bounds_the_attention_logits():
    """Scaling q and k up grows the logits without QK-norm, and leaves them bounded with it."""
    tokens = torch.randint(0, 97, (2, 16))
    logits = {}
    for qk in (None, "rmsnorm"):
        torch.manual_seed(0)
        model = Transformer(tiny(qk_norm=qk)).eval()
        with torch.no_grad():
            for layer in model.layers:
                layer.attn.qkv_proj.weight.mul_(30)
        logits[qk] = _probe(model, tokens)["attn/layers.0/max_logit"]
    head_dim = 8
    assert logits["rmsnorm"] <= math.sqrt(head_dim) + 1e-4  # |q.k| / sqrt(d) <= |q||k| / sqrt(d) = sqrt(d)
    assert logits[None] > 10 * logits["rmsnorm"]


def test_a_planted_massive_activation_is_found_at_its_position_and_feature():
    torch.manual_seed(0)
    h = torch.randn(2, 16, 32)
    h[1, 5, 17] = -2000.0
    stats = massive_stats(h)
    assert (stats["position"], stats["feature"]) == (5, 17)
    assert stats["ratio"] == pytest.approx(2000.0 / h.abs().median().item())
    assert massive_stats(torch.randn(4, 64, 64))["ratio"] < 10  # a Gaussian: about 4-5


def test_sink_mass_of_a_hand_made_attention_pattern():
    # Two heads over 4 positions: head 0 puts 0.8 of every query's weight on position 0, head 1 attends to itself.
    weights = torch.zeros(1, 2, 4, 4)
    for q in range(4):
        weights[0, 0, q, 0] = 0.8 if q else 1.0
        weights[0, 0, q, q] += 0.2 if q else 0.0
        weights[0, 1, q, q] = 1.0
    stats = sink_stats(weights)
    assert stats["sink_mass"] == pytest.approx((0.8 + 0.0) / 2)  # query 0 left out: it can only see itself
    assert stats["sink_heads"] == 0.5  # one of two heads above 0.3


def test_the_probe_pass_reports_sinks_and_massive_activations_per_layer():
    torch.manual_seed(0)
    model = Transformer(tiny())
    metrics = _probe(model, torch.randint(0, 97, (2, 12)))
    for i in range(2):
        assert 0 <= metrics[f"attn/layers.{i}/sink_mass"] <= 1 and 0 <= metrics[f"attn/layers.{i}/sink_heads"] <= 1
        assert metrics[f"act/layers.{i}/massive_ratio"] >= 1 and 0 <= metrics[f"act/layers.{i}/massive_position"] < 12


def test_angular_distance_by_hand():
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    assert angular_distance(x, 3 * x) == pytest.approx(0.0, abs=1e-7)  # same direction, any scale
    assert angular_distance(x, -x) == pytest.approx(1.0)
    turned = torch.tensor([[[0.0, 1.0], [0.0, 5.0]]])  # the first token turned by 90 degrees, the second not
    assert angular_distance(x, turned) == pytest.approx((0.5 + 0.0) / 2)


def test_the_probe_measures_each_blocks_input_against_its_output():
    torch.manual_seed(0)
    model = Transformer(tiny()).eval()
    tokens = torch.randint(0, 97, (2, 8))
    metrics = run_probes(model, tokens, contextlib.nullcontext())
    with torch.no_grad():
        x, cos, sin = model.embed(tokens), model.rope_cos[:8], model.rope_sin[:8]
        for i, layer in enumerate(model.layers):
            out = layer(x, cos, sin, None, 0)
            assert metrics[f"act/layers.{i}/angular_distance"] == pytest.approx(angular_distance(x, out))
            x = out


def test_a_skipped_block_is_put_back_even_when_the_evaluation_fails():
    model = Transformer(tiny())
    block = model.layers[1]
    with pytest.raises(RuntimeError), skipping(model, 1):
        assert isinstance(model.layers[1], SkippedBlock)
        raise RuntimeError("evaluation failed")
    assert model.layers[1] is block
    losses = iter([2.0, 2.5, 2.1])  # plain, without block 0, without block 1
    assert skip_deltas(model, lambda m: next(losses)) == pytest.approx([0.5, 0.1])
