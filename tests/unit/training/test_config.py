"""training/config.py: the typed schema holds every registered norm's options, and refuses what no norm takes."""

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from model.config import NormOptions
from norms import NORM_NAMES, norm_options
from training.config import ConfigError, check_config, check_run_name, register_configs, typed_config

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


def _composed(*overrides: str):
    """The run config ``overrides`` compose, with Hydra's node (its group choices), as train.py's check sees it."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIGS, version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def _refusal(*overrides: str) -> str | None:
    cfg = _composed(*overrides)
    try:
        check_config(typed_config(cfg), cfg.hydra.runtime.choices)
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (
            ["norm=ngpt", "norm.placement=hybrid"],
            "norm=ngpt is nGPT's own model (norm.placement=ngpt), so norm.placement=hybrid would train l2norm in "
            "hybrid blocks with nGPT's training settings: drop norm.placement, or choose norm=l2norm for the L2 "
            "norm in other blocks",
        ),
        (
            ["+variant=ngpt", "norm.placement=pre"],  # a variant that chooses norm=ngpt for its study
            "norm=ngpt is nGPT's own model (norm.placement=ngpt), so norm.placement=pre would train l2norm in pre",
        ),
        (
            ["norm.placement=hybrid", "norm.layer_placements=[pre,post,pre,pre]"],
            "norm.layer_placements=['pre', 'post', 'pre', 'pre'] sets each layer's block, so norm.placement=hybrid "
            "would label the run with blocks it does not build: drop one of the two (a per-layer list stands beside "
            "norm.placement=pre)",
        ),
        (["norm.placement=mix_ln", "norm.layer_placements=[post,pre,pre,pre]"], "so norm.placement=mix_ln would"),
        (["norm=ngpt", "norm.layer_placements=[pre,pre,pre,pre]"], "so norm.placement=ngpt would label the run"),
    ],
    ids=["ngpt-hybrid", "ngpt variant-pre", "hybrid-per layer", "mix_ln-per layer", "ngpt-per layer"],
)
def test_settings_that_contradict_each_other_are_refused_naming_the_fix(overrides, refusal):
    assert refusal in (_refusal(*overrides) or "no refusal")


@pytest.mark.parametrize(
    "overrides",
    [
        ["norm=ngpt"],
        ["norm=l2norm", "norm.placement=hybrid"],  # the L2 norm in HybridNorm's blocks, asked for as such
        ["norm.layer_placements=[post,pre,pre,pre]"],
        *[[f"+variant={path.stem}"] for path in sorted(Path(CONFIGS, "variant").glob("*.yaml"))],
    ],
    ids=lambda overrides: " ".join(overrides),
)
def test_what_combines_passes_and_so_does_every_shipped_variant(overrides):
    assert _refusal(*overrides) is None


def test_without_hydras_choices_the_contradictions_of_plain_keys_are_still_refused():
    """In-process runs (tests, notebooks) compose without Hydra's node: the rows that read plain keys still hold."""
    cfg = _composed("norm.placement=hybrid", "norm.layer_placements=[pre,post,pre,pre]")
    with pytest.raises(ConfigError, match="norm.placement=hybrid would label the run"):
        check_config(typed_config(cfg))


@pytest.mark.parametrize(
    "name, problem",
    [
        ("../escape", "is not one folder name inside runs/"),
        ("/tmp/escape", "is not one folder name inside runs/"),
        ("nested/name", "is not one folder name inside runs/"),
        ("..", "is not one folder name inside runs/"),
        (".", "is not one folder name inside runs/"),
        ("", "is not one folder name inside runs/"),
        ("a" * 256, "is 256 bytes, past the 255 bytes a folder name may have"),
        ("é" * 128, "is 256 bytes, past the 255 bytes"),  # two bytes each in UTF-8: the limit is in bytes
    ],
)
def test_a_run_name_that_is_not_one_folder_name_is_refused(name, problem):
    with pytest.raises(ConfigError, match=f"^run_name=.* {problem}.*choose a"):
        check_run_name(name)


@pytest.mark.parametrize("name", ["a" * 255, "é" * 127, "tiny-rmsnorm-s0-h1a2b3c4", "..hidden", "a.b"])
def test_a_folder_name_of_up_to_255_bytes_is_a_run_name(name):
    check_run_name(name)
