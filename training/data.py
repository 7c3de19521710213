"""One call from the ``data`` config to (tokenizer, training batches, fixed validation windows).

``build_validation`` gives eval.py the validation windows alone, with the checkpoint's tokenizer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from training.batches import TrainBatches, heldout_windows, validation_windows
from training.corpus import load_splits
from training.token_cache import token_array
from training.tokenizer import get_tokenizer, token_byte_lengths


@dataclass
class Data:
    tokenizer: Tokenizer
    train: TrainBatches
    val: torch.Tensor  # (windows, seq_len + 1) token ids
    token_bytes: torch.Tensor  # UTF-8 bytes per token id, for bits per byte
    heldout: torch.Tensor | None  # windows disjoint from val (data.heldout_windows), or None
    unigram_loss: float  # nats/token of the val targets under the training split's token frequencies


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "normlab"


def _cache_dir(data_cfg) -> Path:
    return Path(os.path.expanduser(data_cfg.cache_dir)) if data_cfg.cache_dir else default_cache_dir()


def _validation(val_split, tokenizer: Tokenizer, data_cfg, seq_len: int, cache_dir: Path):
    val_tokens = token_array(val_split, tokenizer, cache_dir, f"{data_cfg.name}-val")
    windows = validation_windows(val_tokens, seq_len, data_cfg.val_windows)
    heldout = None
    if data_cfg.heldout_windows:
        heldout = heldout_windows(val_tokens, seq_len, data_cfg.heldout_windows, data_cfg.val_windows)
    return windows, torch.tensor(token_byte_lengths(tokenizer), dtype=torch.float64), heldout


def unigram_loss(train_tokens, windows: torch.Tensor, vocab_size: int) -> float:
    """The loss of a model that learned only token frequencies (add-one smoothed) on the windows'
    targets: the line below which a run has learned more than the unigram ("did it train?")."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(train_tokens), 1 << 24):  # in chunks: a large corpus is a memory map
        counts += np.bincount(train_tokens[start : start + (1 << 24)], minlength=vocab_size)
    log_p = torch.from_numpy((counts + 1) / (counts.sum() + vocab_size)).log()
    return -log_p[windows[:, 1:]].mean().item()


def build_data(data_cfg, seq_len: int, global_batch: int, seed: int) -> Data:
    cache_dir = _cache_dir(data_cfg)
    train_split, val_split = load_splits(data_cfg)
    tokenizer = get_tokenizer(data_cfg, train_split, cache_dir)
    train_tokens = token_array(train_split, tokenizer, cache_dir, f"{data_cfg.name}-train")
    val, token_bytes, heldout = _validation(val_split, tokenizer, data_cfg, seq_len, cache_dir)
    unigram = unigram_loss(train_tokens, val, tokenizer.get_vocab_size())
    return Data(tokenizer, TrainBatches(train_tokens, seq_len, global_batch, seed), val, token_bytes, heldout, unigram)


def build_validation(data_cfg, seq_len: int, tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(validation windows, bytes per token) with a given tokenizer, e.g. a checkpoint's own.

    Only the validation split is tokenized: evaluating on another corpus never pays for its
    training split.
    """
    _, val_split = load_splits(data_cfg)
    return _validation(val_split, tokenizer, data_cfg, seq_len, _cache_dir(data_cfg))[:2]
