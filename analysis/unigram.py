"""The unigram line: the loss, on a study's validation windows, of a model that learned only token frequencies.

A study counts a variant as trained only once its best loss is well below this line (analysis/study.py).
scripts/run_study.py computes it before the grid and records it in the study's folder (``study_plan.json``);
runs recorded it themselves (``runtime.unigram_val_loss``) while the core computed it, and those records
still count.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.results import read_plan
from training.data import build_data


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


def run_unigram_loss(run) -> float | None:
    """A run's unigram line: its own record, else its study folder's, else None."""
    recorded = (run.config.get("runtime") or {}).get("unigram_val_loss")
    if recorded is not None:
        return recorded
    plan = read_plan([str(run.path.parent)])
    return None if plan is None else plan.get("unigram_val_loss")
