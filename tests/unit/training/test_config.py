"""training/config.py: the typed schema holds every registered norm's options, and refuses what no norm takes."""

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from norms import NORM_NAMES, norm_options
from training.config import NormOptions, register_configs

CONFIGS = str(Path(__file__).resolve().parents[3] / "configs")


def test_the_norm_options_are_exactly_those_the_registered_norms_take():
    """A norm registered with a new option fails here until the schema names it (and a dropped one too)."""
    taken = {option for name in NORM_NAMES for option in norm_options(name)}
    assert {f.name for f in dataclasses.fields(NormOptions)} == taken


def test_a_set_option_is_passed_on_and_the_others_keep_the_norms_defaults():
    assert NormOptions(eps=1e-5, p=0.125).options() == {"eps": 1e-5, "p": 0.125}


def test_composition_refuses_an_option_no_norm_takes():
    register_configs()
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        assert compose("config", overrides=["norm.k=8"]).norm.k == 8
        with pytest.raises(ConfigCompositionException, match="alpha"):
            compose("config", overrides=["norm.alpha=0.5"])
