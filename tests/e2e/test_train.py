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
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError
from tiny_runs import ROOT, compose_config, read_metrics, run_tiny, tiny_overrides

import model.transformer as transformer_module
import training.run.setup as training_setup
from lab.unigram import compute_unigram_val_loss
from model import NormConfig, Transformer
from norms import NORM_NAMES, build_norm
from training.checkpoints.load import load_checkpoint
from training.config import ConfigError, model_config, run_name_keys
from training.run.record import overrides_tag
from training.run.runtime import CPU_COMPILE_MIN_STEPS, should_compile
from training.step.nonfinite import TrainingDiverged
from training.step.optim import build_optimizer, lr_at


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
        "perf/elapsed_s",
        "grad/layers.0",
        "grad/tok_embeddings",
        "act/layers.0.attn_norm/in_rms",
        "act/layers.1.mlp_norm/in_kurtosis",
        "act/final_norm/out_rms",
        "act/layers.1/stream_rms",
    ):
        assert key in keys, key
    assert not any(k.startswith(("attn/", "logits/")) for k in keys)  # the default probes: norms and the stream
    has_gain = build_norm(norm, 8).effective_gain() is not None  # identity and the L2 norm have none
    assert ("act/final_norm/gain_std" in keys) == has_gain
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert rows[-1]["val/ppl"] == pytest.approx(math.exp(rows[-1]["val/loss"]))

    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    expected_backend = build_norm(norm, 8).backend("cpu")  # e.g. c-kernel, triton-interpreter, pytorch
    assert saved["norm"]["name"] == norm
    assert saved["runtime"]["norm_backend"] == {
        "attn_in": expected_backend,
        "mlp_in": expected_backend,
        "final": expected_backend,
    }
    assert saved["runtime"]["norm_roles"]["layers.1.mlp_norm"] == "mlp_in"
    assert (tmp_path / "tokenizer.json").is_file()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0000002.pt", "step_0000004.pt"]


def test_runs_differing_only_in_norm_start_from_the_same_weights(cache_dir):
    states = {}
    for norm in ("rmsnorm", "layernorm"):
        cfg = compose_config(*tiny_overrides(cache_dir, 1, f"norm={norm}"))
        torch.manual_seed(cfg.seed)
        model_cfg = model_config(cfg, 4096)
        states[norm] = {k: v for k, v in Transformer(model_cfg).state_dict().items() if "norm" not in k}
    assert all(torch.equal(states["rmsnorm"][k], states["layernorm"][k]) for k in states["rmsnorm"])


def test_misspelled_key_and_wrong_type_are_rejected_at_composition():
    with pytest.raises((ConfigCompositionException, ConfigAttributeError)):
        compose_config("train.lrr=0.1")
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("train.max_steps=many")
    with pytest.raises((ConfigCompositionException, ConfigAttributeError), match="momentumm"):
        compose_config("train.muon.momentumm=0.9")
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("train.muon.ns_steps=five")
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
    with pytest.raises(ConfigError, match="prmsnorm.*k must be"):
        run_tiny(tmp_path, cache_dir, 1, "norm=prmsnorm", "norm.k=1000")


def _loss_that_turns_nan_at(call: int):
    calls = {"n": 0}
    real = transformer_module.fused_linear_cross_entropy

    def loss(hidden, weight, targets, *options):
        calls["n"] += 1
        terms = real(hidden, weight, targets, *options)
        return type(terms)(*(t * float("nan") for t in terms)) if calls["n"] == call else terms

    return loss


def test_nan_loss_stops_and_names_step_and_checkpoint(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(transformer_module, "fused_linear_cross_entropy", _loss_that_turns_nan_at(3))
    with pytest.raises(TrainingDiverged, match=r"at step 3\. Last good checkpoint: .*step_0000002\.pt"):
        run_tiny(tmp_path, cache_dir, 6)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]  # what was written is kept


def test_nan_policy_skip_skips_the_step_and_continues(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(transformer_module, "fused_linear_cross_entropy", _loss_that_turns_nan_at(3))
    run_tiny(tmp_path, cache_dir, 5, "train.nan_policy=skip")
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [1, 2, 4, 5]


def test_nan_policy_record_ends_the_run_and_a_rerun_keeps_the_result(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setattr(transformer_module, "fused_linear_cross_entropy", _loss_that_turns_nan_at(3))
    run_tiny(tmp_path, cache_dir, 6, "train.nan_policy=record")  # no exception: divergence is a result
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["diverged"] is True and rows[-1]["train/loss"] == "nan"
    assert rows[-1]["train/last_finite_loss"] == rows[1]["train/loss"]
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert run_tiny(tmp_path, cache_dir, 6, "train.nan_policy=record") == {}  # rerun: nothing to train
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_rerunning_a_finished_run_trains_nothing_and_writes_nothing(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert run_tiny(tmp_path, cache_dir, 2) == {}
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("train.nan_policy=ignore", "[stop, skip, record]"),
        (
            "norm.placement=sandwich",
            "[pre, post, peri, reordered, deepnorm, hybrid, pre_qkv, hybrid_star, mix_ln, ngpt]",  # model/registry.py
        ),
        ("norm.qk_axis=rows", "[head, all]"),
        ("norm.gain=unit", "[standard, one_plus, none]"),
        ("norm.roles.q.gain=unit", "[standard, one_plus, none]"),
        ("train.precision=fp16", "[auto, fp32, bf16]"),
        ("logger.mode=live", "[auto, online, offline, disabled]"),
        ("norm.depth_scaling=sqrt", "[none, inverse_sqrt]"),
        ("model.embed_scale=sqrt", "[none, sqrt_d, learned]"),
        ("model.init_out_scale=small", "[inverse_sqrt_2l, none]"),
        ("train.weight_decay_mode=decoupled", "[coupled, independent]"),
        ("train.optimizer=sgd", "[adamw, muon]"),
        ("train.muon.adjust_lr_fn=keller", "[match_rms_adamw, original]"),
    ],
)
def test_a_choice_key_with_a_value_outside_its_choices_is_refused_at_composition(override, allowed):
    with pytest.raises(ConfigCompositionException) as refused:
        compose_config(override)
    message = str(refused.value.__cause__)
    assert f"expected one of {allowed}" in message and f"full_key: {override.split('=')[0]}" in message


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


DESIGN_VARIANTS = {
    "post-norm LayerNorm": ("norm=layernorm", "norm.placement=post"),
    "peri-norm": ("norm.placement=peri",),
    "OLMo 2": ("norm.placement=reordered", "norm.qk=rmsnorm", "norm.qk_axis=all"),
    "Qwen3 QK-norm": ("norm.qk=rmsnorm",),
    "DyT per role": ("norm=dyt", "norm.alpha_init=0.2", "norm.roles.attn_in.alpha_init=0.8"),
    "DyT stream, RMSNorm on q/k": ("norm=dyt", "norm.qk=rmsnorm"),
    "zero-centred gain, fused": ("norm=fused_rmsnorm", "norm.gain=one_plus", "norm.placement=peri"),
    "no gain": ("norm.gain=none",),
    # The design space's second part: logit controls, depth, the papers' recipes.
    "z-loss": ("train.z_loss=1e-4",),
    "final soft-cap": ("model.logit_softcap=30",),
    "attention soft-cap": ("model.attn_softcap=50",),
    "QK-clip": ("train.qk_clip=100",),
    "LayerNorm Scaling": ("norm.depth_scaling=inverse_sqrt", "model.init_out_scale=none"),
    "Mix-LN": ("norm.placement=mix_ln", "norm.post_fraction=0.5"),
    "DeepNorm": ("norm.placement=deepnorm",),
    "DyT recipe": ("norm=dyt", "norm.bias=false", "model.embed_scale=learned"),
    "Gemma embedding scale": ("model.embed_scale=sqrt_d",),
    "independent decay": ("train.weight_decay_mode=independent", "train.weight_decay=1e-4"),
    "composite": (
        "norm=dyt",
        "model.embed_scale=learned",
        "norm.placement=mix_ln",
        "norm.post_fraction=0.25",
        "train.z_loss=1e-4",
    ),  # fmt: skip
}


@pytest.mark.parametrize("variant", DESIGN_VARIANTS)
def test_design_space_variants_train_through_train_py(variant, tmp_path, cache_dir):
    run_tiny(
        tmp_path,
        cache_dir,
        3,
        "train.stats_every=50",
        "train.probes=[norm_io,stream,attention]",
        *DESIGN_VARIANTS[variant],
    )
    rows = read_metrics(tmp_path)
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    last = rows[-1]
    # Statistics are taken at the last step even when the run is shorter than stats_every.
    assert last["step"] == 3 and "attn/layers.1/max_logit" in last and "act/layers.1/stream_rms" in last
    assert any(k.endswith("/in_feature_kurtosis") for k in last)
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert set(record["runtime"]["norm_roles"]) == {k.split("/")[1] for k in last if k.endswith("/in_rms")}


def test_the_logit_controls_log_what_they_do(tmp_path, cache_dir):
    probes = "train.probes=[norm_io,attention,logits,lab.study_probes.timing:NormTime]"  # by name and by path
    run_tiny(tmp_path, cache_dir, 2, "train.z_loss=1e-2", "train.qk_clip=1e-3", "model.logit_softcap=5", probes)
    rows = read_metrics(tmp_path)
    assert all(r["train/z_loss"] > 0 for r in rows if "train/loss" in r)
    # tau far below the logits at init: every head of both layers is clipped at the first step; after
    # that clip the logits sit near tau, so the next step clips only those that grew past it again.
    clipped = [r["train/qk_clipped_heads"] for r in rows if "train/loss" in r]
    assert clipped[0] == 8 and 0 <= clipped[1] <= 8
    last = rows[-1]
    assert last["logits/max"] <= 5 and "logits/log_z" in last and "attn/layers.1/heads.3/max_logit" in last
    assert 0 < last["perf/norm_time_frac"] < 1
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert record["variant"] == "rmsnorm-softcap5-zloss0.01-qkclip0.001"


def test_heldout_windows_are_logged_and_the_lab_draws_the_unigram_line_from_the_runs_data(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2, "data.heldout_windows=2")
    last = read_metrics(tmp_path)[-1]
    assert {"val/loss", "heldout/loss", "heldout/bpb"} <= set(last) and last["heldout/loss"] != last["val/loss"]
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert "unigram_val_loss" not in record["runtime"]  # a study's line, drawn by the lab (lab/unigram.py)
    unigram = compute_unigram_val_loss(OmegaConf.create(record))
    assert 0 < unigram < math.log(4096)  # token frequencies alone beat the uniform guess


def test_dyt_runs_log_saturation_and_role_alphas(tmp_path, cache_dir):
    run_tiny(tmp_path, cache_dir, 2, *DESIGN_VARIANTS["DyT per role"])
    last = read_metrics(tmp_path)[-1]
    assert 0.0 <= last["act/layers.0.attn_norm/saturated"] <= 1.0
    state = load_checkpoint(tmp_path)
    assert state["model_config"]["norm"]["roles"] == {"attn_in": {"alpha_init": 0.8}}
    assert state["model"]["layers.0.attn_norm.alpha"].item() == pytest.approx(0.8, abs=0.05)


@pytest.mark.parametrize(
    "override, message",
    [
        ("norm.qk=batchnorm", "unknown norm 'batchnorm'"),
        ("norm.alpha_init=0.5", "'rmsnorm' does not take option\\(s\\) alpha_init"),
        ("train.z_loss=-1e-4", "train.z_loss=-0.0001 is not allowed: it must be >= 0"),
        ("train.qk_clip=0", "train.qk_clip=0.0 is not allowed: it must be > 0 or null"),
        ("train.qk_clip=-5", "train.qk_clip=-5.0 is not allowed: it must be > 0 or null"),
        ("model.logit_softcap=0", "model.logit_softcap=0.0 is not allowed: it must be > 0 or null"),
        ("model.attn_softcap=-50", "model.attn_softcap=-50.0 is not allowed: it must be > 0 or null"),
        ("norm.post_fraction=1.5", "norm.post_fraction=1.5 is not allowed: it must be in \\[0, 1\\]"),
        ("norm.layer_placements=[pre,post,pre]", "norm.layer_placements has 3 entries for model.n_layers=2"),
        ("norm.layer_placements=[pre,side]", "'side' is not a layer's block; each layer takes one of: pre, post"),
        ("train.qk_clip=100 norm.qk=rmsnorm", "normalize away: use one of them"),
        ("train.qk_clip=100 norm.placement=hybrid", "normalize away: use one of them"),
        ("norm.after_linear=rmsnorm norm.placement=peri", "PeriNormBlock normalizes again: use it with"),
        ("norm.v=batchnorm", "unknown norm 'batchnorm'"),
    ],
)
def test_bad_design_choices_fail_before_the_data_is_loaded(override, message, tmp_path, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("the data was loaded before the config was checked")

    monkeypatch.setattr(training_setup, "open_corpus", no_data)
    with pytest.raises(ConfigError, match=message):
        run_tiny(tmp_path, str(tmp_path / "cache"), 1, *override.split())
    assert not (tmp_path / "config.yaml").exists()


def test_misspelled_role_or_role_option_is_rejected_at_composition():
    with pytest.raises((ConfigCompositionException, ConfigAttributeError)):
        compose_config("norm.roles.attention.eps=1e-5")
    with pytest.raises((ConfigCompositionException, ConfigAttributeError)):
        compose_config("norm=dyt", "norm.roles.attn_in.alpha=0.8")


def test_multirun_sweeps_norms_and_placements(tmp_path, cache_dir):
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "norm=rmsnorm,layernorm,dyt",
            "norm.placement=pre,peri,post",
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
    runs = {p.name for p in tmp_path.iterdir() if (p / "metrics.jsonl").exists()}
    # The tiny model's shorter schedule and batch are in the hash; the variant is in the readable name.
    tag = overrides_tag(tiny_overrides(cache_dir, 2), run_name_keys())
    variants = [
        f"{norm}{'' if placement == 'pre' else '-' + placement}"
        for norm in ("rmsnorm", "layernorm", "dyt")
        for placement in ("pre", "peri", "post")
    ]
    assert tag and runs == {f"{i}-tiny-{variant}-s0{tag}" for i, variant in enumerate(variants)}


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = SimpleNamespace(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # halfway through the cosine: (1 + 0.1) / 2
    assert lr_at(110, cfg) == pytest.approx(0.1) and lr_at(500, cfg) == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    from model import ModelConfig, Transformer

    model = Transformer(
        ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, norm=NormConfig(name="layernorm"))
    )
    cfg = SimpleNamespace(
        optimizer="adamw", weight_decay=0.1, weight_decay_mode="coupled", decay_norms_and_embeddings=False, lr=1e-3,
        beta1=0.9, beta2=0.95,
    )  # fmt: skip
    decay, no_decay = build_optimizer(model, cfg, torch.device("cpu")).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("proj.weight") for p in decay["params"])
    undecayed = {names[id(p)] for p in no_decay["params"]}
    assert "tok_embeddings.weight" in undecayed and "final_norm.bias" in undecayed
    assert "layers.0.attn_norm.weight" in undecayed


def test_compile_by_default_on_gpus_and_long_cpu_runs():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert should_compile(None, cuda, 10)
    assert not should_compile(None, cpu, 600)  # the default run: compiling would not pay back
    assert should_compile(None, cpu, CPU_COMPILE_MIN_STEPS)
    assert not should_compile(False, cuda, 10**6) and should_compile(True, cpu, 1)
