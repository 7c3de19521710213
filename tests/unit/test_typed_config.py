"""Hydra's composed config stops at the entry points: train.py and eval.py turn it into one typed object, and no
function of normlab's packages below them receives a DictConfig or a ListConfig (watched call by call)."""

import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig
from tiny_runs import CONFIG_DIR, compose_composed, tiny_overrides

import eval as eval_script
import train as train_script
from training.config import typed_config

ROOT = Path(__file__).resolve().parents[2]
BELOW = tuple(str(ROOT / package) + "/" for package in ("norms", "model", "training", "variants"))


class Watch:
    """Every call into our packages whose arguments hold a DictConfig or a ListConfig, as (function, argument)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.ours: dict = {}

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        ours = self.ours.get(code)
        if ours is None:
            ours = self.ours[code] = code.co_filename.startswith(BELOW)
        if not ours:
            return
        for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            if isinstance(frame.f_locals.get(name), (DictConfig, ListConfig)):
                self.seen.append((f"{code.co_filename.removeprefix(str(ROOT) + '/')}:{code.co_name}", name))

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def test_no_function_below_train_py_receives_a_dictconfig(tmp_path, cache_dir):
    cfg = typed_config(compose_composed(*tiny_overrides(cache_dir, 2), "norm.qk=rmsnorm", "train.optimizer=muon"))
    with Watch() as watch:
        train_script.train(cfg, tmp_path / "run")
    assert watch.seen == []


def test_no_function_below_eval_py_receives_a_dictconfig(tmp_path, cache_dir):
    train_script.train(typed_config(compose_composed(*tiny_overrides(cache_dir, 2))), tmp_path / "run")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        composed = compose("eval", overrides=[f"checkpoint={tmp_path / 'run'}", "max_new_tokens=2", "num_samples=1"])
    cfg = eval_script.typed_eval_config(composed)
    with Watch() as watch:
        eval_script.run_eval(cfg, tmp_path / "out")
    assert watch.seen == []


def test_the_watch_sees_a_dictconfig_passed_down(tmp_path, cache_dir):
    """The watch itself: handing the composed config to a function of training/ is seen."""
    from training.run.setup import check_run_identity

    with Watch() as watch:
        check_run_identity(compose_composed("model=tiny"), tmp_path, None)
    assert ("training/run/setup.py:check_run_identity", "cfg") in watch.seen
