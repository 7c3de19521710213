"""train.py: configs composed with Hydra's compose API, tiny runs in-process, and the CLI."""

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigAttributeError, ValidationError
from tiny_runs import ROOT, compose_config, read_metrics, run_tiny, tiny_overrides

import model.transformer as transformer_module
import train as train_script
from norms import NORM_NAMES
from training.config import RUN_NAME_KEYS
from training.optim import build_optimizer, lr_at
from training.run_record import overrides_tag


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("norm", NORM_NAMES)
def test_smoke_run_logs_every_key_group(norm, tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 4, f"norm={norm}")
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    keys = set().union(*rows)
    for key in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "val/loss",
        "val/ppl",
        "val/bpb",
        "perf/tokens_per_sec",
        "perf/mfu",
        "perf/peak_mem_gb",
        "perf/norm_time_frac",
        "perf/elapsed_s",
        "grad/layers.0",
        "grad/tok_embeddings",
        "act/layers.0.attn_norm/in_rms",
        "act/layers.1.mlp_norm/in_kurtosis",
        "act/final_norm/out_rms",
        "act/final_norm/gain_std",
    ):
        assert key in keys, key
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert rows[-1]["val/ppl"] == pytest.approx(math.exp(rows[-1]["val/loss"]))

    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    expected_backend = "triton-interpreter" if norm == "fused_rmsnorm" else "pytorch"
    assert saved["norm"]["name"] == norm and saved["runtime"]["norm_backend"] == expected_backend
    assert (tmp_path / "tokenizer.json").is_file()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000002.pt", "step_0000004.pt"]


def test_runs_differing_only_in_norm_start_from_the_same_weights(cache_dir):
    states = {}
    for norm in ("rmsnorm", "layernorm"):
        cfg = compose_config(*tiny_overrides(cache_dir, 1, f"norm={norm}"))
        torch.manual_seed(cfg.seed)
        model_cfg = train_script.build_model_config(cfg, 4096)
        states[norm] = {k: v for k, v in train_script.Transformer(model_cfg).state_dict().items() if "norm" not in k}
    assert all(torch.equal(states["rmsnorm"][k], states["layernorm"][k]) for k in states["rmsnorm"])


def test_misspelled_key_and_wrong_type_are_rejected_at_composition():
    with pytest.raises((ConfigCompositionException, ConfigAttributeError)):
        compose_config("train.lrr=0.1")
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("train.max_steps=many")
    with pytest.raises(ConfigCompositionException, match="rmsnorm"):  # Hydra lists the available norms
        compose_config("norm=batchnorm")


def test_cli_rejects_a_bad_key_before_training(tmp_path):
    result = subprocess.run(
        [sys.executable, "train.py", "train.lrr=0.1", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "lrr" in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_bad_norm_option_is_a_config_error(tmp_path, cache_dir):
    with pytest.raises(train_script.ConfigError, match="prmsnorm.*k must be"):
        run_tiny(tmp_path, cache_dir, 1, "norm=prmsnorm", "norm.k=1000")


def _loss_that_turns_nan_at(call: int):
    calls = {"n": 0}
    real = transformer_module.fused_linear_cross_entropy

    def loss(hidden, weight, targets):
        calls["n"] += 1
        value = real(hidden, weight, targets)
        return value * float("nan") if calls["n"] == call else value

    return loss


def test_nan_loss_stops_and_names_step_and_checkpoint(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(transformer_module, "fused_linear_cross_entropy", _loss_that_turns_nan_at(3))
    with pytest.raises(train_script.TrainingDiverged, match=r"at step 3\. Last good checkpoint: .*step_0000002\.pt"):
        run_tiny(tmp_path, cache_dir, 6)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]  # what was written is kept


def test_nan_policy_skip_skips_the_step_and_continues(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(transformer_module, "fused_linear_cross_entropy", _loss_that_turns_nan_at(3))
    run_tiny(tmp_path, cache_dir, 5, "train.nan_policy=skip")
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [1, 2, 4, 5]


def test_wandb_offline_writes_a_run_in_the_run_directory(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_tiny(tmp_path, cache_dir, 2, "logger=wandb", "logger.mode=offline")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (tmp_path / "metrics.jsonl").is_file()  # metrics.jsonl is written whatever wandb does


def test_wandb_disabled_writes_no_wandb_files(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2, "logger=wandb", "logger.mode=disabled")
    assert not list(tmp_path.glob("wandb/*run-*"))
    assert len(read_metrics(tmp_path)) == 2


def test_multirun_sweeps_every_norm(tmp_path, cache_dir):
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "norm=" + ",".join(NORM_NAMES),
            *tiny_overrides(cache_dir, 2),
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(p.name for p in tmp_path.iterdir() if (p / "metrics.jsonl").exists())
    # The tiny model's shorter schedule and batch are in the hash; the norm is in the readable name.
    tag = overrides_tag(tiny_overrides(cache_dir, 2), RUN_NAME_KEYS)
    assert tag and runs == [f"{i}-tiny-{norm}-s0{tag}" for i, norm in enumerate(NORM_NAMES)]


def test_plan_batches():
    cfg = SimpleNamespace(global_batch_tokens=None, batch_size=4)
    assert train_script.plan_batches(cfg, 64, 1) == (4, 1)
    cfg = SimpleNamespace(global_batch_tokens=64 * 16, batch_size=4)
    assert train_script.plan_batches(cfg, 64, 1) == (16, 4)
    assert train_script.plan_batches(cfg, 64, 2) == (16, 2)
    with pytest.raises(train_script.ConfigError, match="change train.batch_size or train.global_batch_tokens"):
        train_script.plan_batches(SimpleNamespace(global_batch_tokens=64 * 6, batch_size=4), 64, 1)


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = SimpleNamespace(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the cosine: (1 + 0.1) / 2
    assert lr_at(110, cfg) == pytest.approx(0.1) and lr_at(500, cfg) == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    from model import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, norm="layernorm"))
    cfg = SimpleNamespace(weight_decay=0.1, decay_norms_and_embeddings=False, lr=1e-3, beta1=0.9, beta2=0.95)
    decay, no_decay = build_optimizer(model, cfg, torch.device("cpu")).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("proj.weight") for p in decay["params"])
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert "tok_embeddings.weight" in undecayed and "final_norm.bias" in undecayed
    assert "layers.0.attn_norm.weight" in undecayed
