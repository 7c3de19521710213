"""nGPT through train.py: its config composes as a norm choice, it trains on the sphere, and it resumes exactly."""

import pytest
from tiny_runs import compose_config, read_metrics, run_tiny

from training.checkpoints.files import list_checkpoints


@pytest.mark.parametrize("train", ["default", "gpu"])
def test_norm_ngpt_sets_its_model_and_training_parts_over_the_groups_defaults(train):
    cfg = compose_config("norm=ngpt", f"train={train}")
    assert (cfg.norm.name, cfg.norm.placement, cfg.model.tie_embeddings) == ("l2norm", "ngpt", False)
    assert (cfg.train.weight_decay, cfg.train.warmup_steps) == (0.0, 0)  # as the paper trains
    assert compose_config("norm=ngpt", "train.warmup_steps=100").train.warmup_steps == 100  # the command line wins
    assert compose_config("norm=rmsnorm").train.weight_decay == 0.1  # other norms keep the train group's


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_an_interrupted_ngpt_run_resumes_bit_for_bit_on_the_sphere(tmp_path, cache_dir, optimizer):
    """The renormalization after every step is part of the step: a run resumed from step 2 logs what an
    uninterrupted one logs (with Muon too, whose views of the fused weights are renormalized in place)."""
    extra = ("norm=ngpt", f"train.optimizer={optimizer}", "train.probes=[stream,lab.study_probes.ngpt:NGPTScales]")
    run_tiny(tmp_path / "whole", cache_dir, 4, *extra)
    interrupted = tmp_path / "interrupted"
    run_tiny(interrupted, cache_dir, 4, *extra)
    list_checkpoints(interrupted)[-1].unlink()  # as if killed after the step-2 checkpoint
    run_tiny(interrupted, cache_dir, 4, *extra)
    whole, resumed = read_metrics(tmp_path / "whole"), read_metrics(interrupted)
    assert [r["train/loss"] for r in resumed if "train/loss" in r] == [
        r["train/loss"] for r in whole if "train/loss" in r
    ]
    norms = [v for r in resumed for k, v in r.items() if k.endswith("/stream_norm")]
    assert norms and all(abs(v - 1) < 1e-5 for v in norms)  # the probe's check: the state stays on the sphere
