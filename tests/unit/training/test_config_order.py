"""A run is the same whichever order Hydra applies ``+experiment`` and ``+variant`` in.

Both are appended global configs, so the later one wins where both set a key, and a multirun's
sweeper puts the experiment's own sweep axes (``+variant``) before the command line's ``+experiment``.
An experiment that set a key one of its variants sets would silently override the variant in every
swept run (it did: the nGPT study's no-warmup arm trained with warmup). The recipe therefore lives in
a train preset, which the variants' groups and keys compose after; this test holds every experiment
to that, for every variant it sweeps.
"""

import functools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from training.config import register_configs

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
register_configs()  # the schema, before the cases are composed at collection
EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))


@functools.cache
def sweep_params(experiment: str) -> tuple[str, ...]:
    """The experiment's own sweep axes, as the sweeper reads them (``+variant=a,b``, ``train.lr=...``)."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
    return tuple(f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items())


def swept_variants(experiment: str) -> list[str]:
    axis = next((p for p in sweep_params(experiment) if p.startswith("+variant=")), None)
    return axis.split("=", 1)[1].split(",") if axis else []


def job_overrides(experiment: str, variant: str) -> list[str]:
    """The overrides of one job of ``python train.py -m +experiment=<e>``, in the order the sweeper gives them."""
    parsed = OverridesParser.create().parse_overrides([*sweep_params(experiment), f"+experiment={experiment}"])
    jobs = BasicSweeper.split_arguments(parsed, None)[0]
    return next(job for job in jobs if f"+variant={variant}" in job)


CASES = [(e, v) for e in EXPERIMENTS for v in swept_variants(e)]


def test_every_study_experiment_sweeps_variants():
    assert {"stability", "ngpt", "optimizer", "outliers"} <= {e for e, _ in CASES}


@pytest.mark.parametrize(("experiment", "variant"), CASES, ids=[f"{e}-{v}" for e, v in CASES])
def test_the_sweepers_order_composes_what_the_experiment_then_the_variant_does(experiment, variant):
    swept = job_overrides(experiment, variant)
    assert swept.index(f"+variant={variant}") < swept.index(f"+experiment={experiment}")  # the order that bit
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        as_swept = compose("config", overrides=swept)
        variant_last = compose(
            "config", overrides=[f"+experiment={experiment}", *(o for o in swept if "experiment" not in o)]
        )
    assert OmegaConf.to_container(as_swept) == OmegaConf.to_container(variant_last)


def test_ngpt_trains_without_warmup_or_decay_in_its_study_and_with_warmup_in_its_warmup_arm():
    jobs = {v: job_overrides("ngpt", v) for v in ("ngpt", "ngpt_warmup", "rmsnorm")}
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        plain, warm, base = (compose("config", overrides=jobs[v]).train for v in jobs)
    assert (plain.warmup_steps, plain.weight_decay) == (0, 0.0)
    assert (warm.warmup_steps, warm.weight_decay) == (40, 0.0)
    assert (base.warmup_steps, base.weight_decay, base.eval_every) == (40, 1e-4, 25)
