"""The studies' probes (lab/study_probes/): massive activations, attention sinks, layer importance, by hand."""

import contextlib

import pytest
import torch

from lab.study_probes import STUDY_PROBES
from lab.study_probes.attention_sinks import sink_stats
from lab.study_probes.layer_importance import SkippedBlock, angular_distance, skip_deltas, skipping
from lab.study_probes.massive import massive_stats
from model import ModelConfig, Transformer
from training.telemetry.probes import resolve_probe, run_probes

STUDY = [resolve_probe(path) for path in STUDY_PROBES]


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, mlp_multiple_of=16)
    return ModelConfig(**{**base, **overrides})


def _probe(model, tokens):
    return run_probes(model, tokens, contextlib.nullcontext(), STUDY)


def test_a_planted_massive_activation_is_found_at_its_position_feature_and_token():
    torch.manual_seed(0)
    h = torch.randn(2, 16, 32)
    h[1, 5, 17] = -2000.0
    tokens = torch.arange(32).reshape(2, 16)  # the token of row 1, position 5 is 21; row 0's there is 5
    stats = massive_stats(h, tokens)
    assert (stats["position"], stats["feature"], stats["token"]) == (5, 17, 21)
    assert stats["ratio"] == pytest.approx(2000.0 / h.abs().median().item())
    assert massive_stats(torch.randn(4, 64, 64), torch.zeros(4, 64, dtype=torch.long))["ratio"] < 10  # Gaussian: 4-5


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
    tokens = torch.randint(0, 97, (2, 12))
    metrics = _probe(model, tokens)
    for i in range(2):
        assert 0 <= metrics[f"attn/layers.{i}/sink_mass"] <= 1 and 0 <= metrics[f"attn/layers.{i}/sink_heads"] <= 1
        assert metrics[f"act/layers.{i}/massive_ratio"] >= 1 and 0 <= metrics[f"act/layers.{i}/massive_position"] < 12
        assert metrics[f"act/layers.{i}/massive_token"] in tokens  # one of the pass's own tokens


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
    metrics = _probe(model, tokens)
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
