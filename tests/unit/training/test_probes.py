"""The probe pass: statistics that mean the same thing in every placement, attention and outlier features."""

import contextlib
import math

import pytest
import torch

from model import ModelConfig, NormConfig, Transformer
from model.attention import masked_scores
from training.telemetry.probes import PROBES, resolve_probe, run_probes
from training.telemetry.probes.attention import attention_stats
from training.telemetry.probes.base import Probe, feature_kurtosis
from training.telemetry.probes.norm_io import NormInputOutput

CORE_PROBES = [resolve_probe(name) for name in PROBES]


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
    return run_probes(model, tokens, contextlib.nullcontext(), CORE_PROBES)


def _rms(t):
    return t.double().pow(2).mean().sqrt().item()


@pytest.mark.parametrize("placement", ["pre", "post", "peri", "reordered"])
def test_norm_statistics_describe_what_each_norm_sees_in_every_placement(placement):
    torch.manual_seed(0)
    model = Transformer(tiny(norm=NormConfig(placement=placement))).eval()
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
    model = Transformer(tiny(norm=NormConfig(qk="rmsnorm")))
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
        model = Transformer(tiny(norm=NormConfig(qk=qk))).eval()
        with torch.no_grad():
            for layer in model.layers:
                layer.attn.qkv_proj.weight.mul_(30)
        logits[qk] = _probe(model, tokens)["attn/layers.0/max_logit"]
    head_dim = 8
    assert logits["rmsnorm"] <= math.sqrt(head_dim) + 1e-4  # |q.k| / sqrt(d) <= |q||k| / sqrt(d) = sqrt(d)
    assert logits[None] > 10 * logits["rmsnorm"]


class _Order(Probe):
    """Records which probe's hook on the final norm ran first."""

    seen: list = []

    def attach(self, model) -> None:
        self.hook(model.final_norm, lambda *_: _Order.seen.append(type(self).__name__))


class _First(_Order):
    attach_order = -1


def test_a_probe_is_chosen_by_name_or_by_its_import_path_and_attaches_in_its_order():
    assert resolve_probe("norm_io") is NormInputOutput
    assert resolve_probe("training.telemetry.probes.norm_io:NormInputOutput") is NormInputOutput
    _Order.seen.clear()
    run_probes(Transformer(tiny()), torch.randint(0, 97, (1, 4)), contextlib.nullcontext(), [_Order, _First])
    assert _Order.seen == ["_First", "_Order"]  # listed second, attached first


@pytest.mark.parametrize(
    "name, message",
    [
        ("norm_iox", "is neither a core probe \\(norm_io, stream, attention, logits\\)"),
        ("training.telemetry.probes.norm_io:Missing", "cannot be imported"),
        ("training.telemetry.probes.base:rms_and_mean", "is not a probe"),
    ],
)
def test_a_name_that_is_no_probe_is_refused_naming_the_choices(name, message):
    with pytest.raises(ValueError, match=f"train.probes: '{name}' {message}"):
        resolve_probe(name)
