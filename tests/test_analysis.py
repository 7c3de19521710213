"""The analysis package's contracts: metric keys by declared templates, the statistics, claim verdicts."""

import contextlib
import statistics

import pytest
import torch

from analysis.claims import verdict
from analysis.keys import UnknownMetricKey, fields, instances, metric_key
from analysis.stats import bootstrap_ci, paired_p_value, welch_p_value
from model import ModelConfig, Transformer
from training.probes import PROBES, declared_keys, layer_grad_norms, run_probes


def test_a_reader_asking_for_an_undeclared_key_fails():
    assert metric_key("act/layers.{i}/stream_rms") == "act/layers.{i}/stream_rms"
    with pytest.raises(UnknownMetricKey, match="act/layers.{i}/stream_rmss"):
        metric_key("act/layers.{i}/stream_rmss")
    with pytest.raises(UnknownMetricKey):
        metric_key("act/layers.3/stream_rms")  # a filled-in key is not a template


def test_templates_match_keys_field_by_field():
    assert fields("act/{norm}/in_rms", "act/layers.0.attn_norm/in_rms") == {"norm": "layers.0.attn_norm"}
    assert fields("act/{norm}/in_rms", "act/layers.0.attn_norm/in_rms_x") is None
    assert fields("act/layers.{i}/stream_rms", "act/layers.12/stream_rms") == {"i": "12"}
    keys = ["act/final_norm/in_rms", "act/layers.0/stream_rms", "act/layers.0.mlp_norm/in_rms", "act/final_norm/in_rms"]
    assert instances("act/{norm}/in_rms", keys, "norm") == ["final_norm", "layers.0.mlp_norm"]


def test_the_probes_write_exactly_the_keys_they_declare():
    """Every key a probe pass writes matches a declared template, and every declared template is written
    (DyT for the saturation key, an RMSNorm QK-norm for the gain keys)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, norm="dyt")
    cfg.qk_norm, cfg.mlp_multiple_of = "rmsnorm", 16
    model = Transformer(cfg)
    written = set(run_probes(model, torch.randint(0, 97, (2, 8)), contextlib.nullcontext()))
    model(torch.randint(0, 97, (2, 8)), torch.randint(0, 97, (2, 8))).objective.backward()
    written |= set(layer_grad_norms(model))
    unmatched = sorted(k for k in written if not any(fields(t, k) is not None for t in declared_keys()))
    assert not unmatched, f"written but not declared: {unmatched}"
    probe_templates = [t for probe in PROBES for t in probe.keys]
    never = [t for t in probe_templates if not any(fields(t, k) is not None for k in written)]
    assert not never, f"declared but never written: {never}"


def test_paired_t_test_by_hand():
    # Differences 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.464 with 2 df; P(|T| > t) = 1 - t / sqrt(t^2 + 2).
    t = 2 * 3**0.5
    assert paired_p_value([2, 4, 6], [1, 2, 3]) == pytest.approx(1 - t / (t * t + 2) ** 0.5, rel=1e-9)
    assert paired_p_value([1.0], [0.0]) is None
    assert paired_p_value([1, 2], [1, 2]) == 1.0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_p_value([1, 2], [1])
    # Pairing removes what the seeds share: the same gap buried in seed-to-seed spread.
    a, b = [4.0, 5.0, 6.0, 7.0], [4.1, 5.1, 6.12, 7.09]
    assert paired_p_value(a, b) < 0.001 < 0.5 < welch_p_value(a, b)


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_values():
    values = [0.1, -0.2, 0.3, 0.05, 0.15, -0.05]
    low, high = bootstrap_ci(values)
    assert low < statistics.fmean(values) < high and min(values) <= low and high <= max(values)
    assert bootstrap_ci(values) == bootstrap_ci(values)  # seeded: a report is reproducible
    wide = bootstrap_ci(values[:3])
    narrow = bootstrap_ci(values * 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert bootstrap_ci([1.0]) is None


@pytest.mark.parametrize(
    "expect, ci, margin, expected",
    [
        ("lower", (-0.3, -0.1), 0.0, "agrees"),
        ("lower", (0.1, 0.3), 0.0, "disagrees"),
        ("lower", (-0.1, 0.2), 0.0, "inconclusive"),
        ("higher", (0.1, 0.3), 0.0, "agrees"),
        ("higher", (-0.3, -0.1), 0.0, "disagrees"),
        ("similar", (-0.02, 0.03), 0.05, "agrees"),
        ("similar", (0.08, 0.2), 0.05, "disagrees"),
        ("similar", (-0.02, 0.2), 0.05, "inconclusive"),
        ("lower", None, 0.0, "inconclusive"),
    ],
)
def test_the_verdict_follows_the_interval(expect, ci, margin, expected):
    assert verdict(expect, ci, margin) == expected
