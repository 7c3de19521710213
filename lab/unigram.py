"""The unigram line: the loss, on a study's validation windows, of a model that learned only token frequencies.

A study counts a variant as trained only once its best loss is well below this line (lab/study.py).
python -m lab study computes it before the grid and records it in the study's folder (``study_plan.json``);
runs recorded it themselves (``runtime.unigram_val_loss``) while the core computed it, and those records
still count. A reader of runs of neither kind (the DyT map, trained with ``train.py -m``) asks for the line
computed from their config's data, once per corpus and sequence length; the studies' readers do not, so
what counts as trained in a committed study does not change with the machine that reads it.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import torch
from omegaconf import OmegaConf

from lab.results import read_plan
from training.data.build import build_data


def unigram_loss(train_tokens, windows: torch.Tensor, vocab_size: int) -> float:
    """The loss of a model that learned only token frequencies (add-one smoothed) on the windows'
    targets: the line below which a run has learned more than the unigram ("did it train?")."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(train_tokens), 1 << 24):  # in chunks: a large corpus is a memory map
        counts += np.bincount(train_tokens[start : start + (1 << 24)], minlength=vocab_size)
    log_p = torch.from_numpy((counts + 1) / (counts.sum() + vocab_size)).log()
    return -log_p[windows[:, 1:]].mean().item()


def compute_unigram_val_loss(cfg) -> float:
    """The unigram line of a composed run config's validation windows (its data, tokenizer and sequence length)."""
    data = build_data(cfg.data, cfg.train.seq_len or cfg.model.max_seq_len, global_batch=1, seed=0)
    return unigram_loss(data.train.tokens, data.val, data.tokenizer.get_vocab_size())


@functools.cache
def _computed(data_and_seq_len: str) -> float | None:
    config = json.loads(data_and_seq_len)
    try:
        return compute_unigram_val_loss(OmegaConf.create(config))
    except (KeyError, OSError, ValueError):  # a run whose data cannot be built here
        return None


def run_unigram_loss(run, compute: bool = False) -> float | None:
    """A run's unigram line: its own record, else its study folder's, else (``compute``) computed from its data
    config, None where that data cannot be built here."""
    recorded = (run.config.get("runtime") or {}).get("unigram_val_loss")
    if recorded is not None:
        return recorded
    plan = read_plan([str(run.path.parent)])
    if plan is not None and plan.get("unigram_val_loss") is not None:
        return plan["unigram_val_loss"]
    config = run.config
    if not compute or not all(key in config for key in ("data", "train", "model")):
        return None
    seq_len = {
        "train": {"seq_len": config["train"].get("seq_len")},
        "model": {"max_seq_len": config["model"].get("max_seq_len")},
    }
    return _computed(json.dumps({"data": config["data"], **seq_len}, sort_keys=True))
