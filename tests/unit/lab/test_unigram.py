"""lab/unigram.py: the unigram line by hand, and where a run's line is read from."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from tiny_runs import compose_config, tiny_overrides

from lab.runs import Run
from lab.unigram import compute_unigram_val_loss, run_unigram_loss, unigram_loss


def test_unigram_loss_by_hand():
    # Training tokens 0, 0, 1 over a vocabulary of 3, add-one smoothed: p = 3/6, 2/6, 1/6.
    windows = torch.tensor([[1, 0, 2]])  # targets 0 and 2
    expected = -(math.log(3 / 6) + math.log(1 / 6)) / 2
    assert unigram_loss(np.array([0, 0, 1], dtype=np.uint16), windows, 3) == pytest.approx(expected)


def _run(path, runtime):
    return Run(path=path, config={"runtime": runtime}, rows=[], tokenizer_hash="")


def test_a_runs_line_is_its_own_record_else_its_study_folders(tmp_path):
    run_dir = tmp_path / "study" / "run"
    run_dir.mkdir(parents=True)
    assert run_unigram_loss(_run(run_dir, {"unigram_val_loss": 6.1})) == 6.1
    assert run_unigram_loss(_run(run_dir, {})) is None
    (tmp_path / "study" / "study_plan.json").write_text(json.dumps({"unigram_val_loss": 6.0}))
    assert run_unigram_loss(_run(run_dir, {})) == 6.0


def test_a_run_with_no_record_gets_the_line_computed_from_its_data(tmp_path, cache_dir):
    """A map trained with train.py -m records no line; asked, its config's data gives it as `python -m lab study` computes it."""
    cfg = compose_config(*tiny_overrides(cache_dir))
    config = {**dataclasses.asdict(cfg), "runtime": {}}
    run = Run(path=tmp_path / "run", config=config, rows=[], tokenizer_hash="")
    assert run_unigram_loss(run) is None  # a study's reader does not compute it
    line = run_unigram_loss(run, compute=True)
    assert line == compute_unigram_val_loss(cfg) and 0 < line < math.log(cfg.data.vocab_size)
