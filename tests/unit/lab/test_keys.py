"""lab/keys.py: readers ask for metric keys by the templates the probes declare, and every template is written."""

import contextlib

import pytest
import torch

from lab.keys import UnknownMetricKey, every_declared_key, fields, instances, metric_key
from lab.study_probes import STUDY_PROBES
from model import ModelConfig, NormConfig, build_model
from training.telemetry.probes import PROBES, resolve_probe, run_probes
from training.telemetry.probes.gradients import layer_grad_norms

EVERY_PROBE = [resolve_probe(name) for name in (*PROBES, *STUDY_PROBES)]


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
    (DyT for the saturation key, an RMSNorm QK-norm for the gain keys, nGPT for its scales; HybridNorm*,
    SimpleNorm, gates and sinks write the same templates)."""
    torch.manual_seed(0)
    shape = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16, mlp_multiple_of=16)
    written = set()
    for model in (
        build_model(ModelConfig(**shape, norm=NormConfig(name="dyt", qk="rmsnorm"))),
        build_model(ModelConfig(**shape, tie_embeddings=False, norm=NormConfig(name="l2norm", placement="ngpt"))),
        build_model(
            ModelConfig(**shape, attn_gate="elementwise", attn_sink="learned", norm=NormConfig(placement="hybrid_star"))
        ),
        build_model(ModelConfig(**shape, attn_gate="headwise", norm=NormConfig(after_linear="rmsnorm"))),
    ):
        written |= set(run_probes(model, torch.randint(0, 97, (2, 8)), contextlib.nullcontext(), EVERY_PROBE))
        model(torch.randint(0, 97, (2, 8)), torch.randint(0, 97, (2, 8))).objective.backward()
        written |= set(layer_grad_norms(model))
    unmatched = sorted(k for k in written if not any(fields(t, k) is not None for t in every_declared_key()))
    assert not unmatched, f"written but not declared: {unmatched}"
    probe_templates = [t for probe in EVERY_PROBE for t in probe.keys]
    never = [t for t in probe_templates if not any(fields(t, k) is not None for k in written)]
    assert not never, f"declared but never written: {never}"
