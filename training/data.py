"""One call from the ``data`` config to (tokenizer, training batches, fixed validation windows)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.batches import TrainBatches, validation_windows
from training.corpus import load_splits
from training.token_cache import token_array
from training.tokenizer import get_tokenizer, token_byte_lengths


@dataclass
class Data:
    tokenizer: Tokenizer
    train: TrainBatches
    val: torch.Tensor  # (windows, seq_len + 1) token ids
    token_bytes: torch.Tensor  # UTF-8 bytes per token id, for bits per byte


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "normlab"


def build_data(data_cfg, seq_len: int, global_batch: int, seed: int, tokenizer: Tokenizer | None = None) -> Data:
    """``tokenizer`` given (eval.py passes a checkpoint's own) replaces the one ``data.tokenizer`` names."""
    cache_dir = Path(os.path.expanduser(data_cfg.cache_dir)) if data_cfg.cache_dir else default_cache_dir()
    train_split, val_split = load_splits(data_cfg)
    tokenizer = tokenizer or get_tokenizer(data_cfg, train_split, cache_dir)
    train_tokens = token_array(train_split, tokenizer, cache_dir, f"{data_cfg.name}-train")
    val_tokens = token_array(val_split, tokenizer, cache_dir, f"{data_cfg.name}-val")
    return Data(
        tokenizer=tokenizer,
        train=TrainBatches(train_tokens, seq_len, global_batch, seed),
        val=validation_windows(val_tokens, seq_len, data_cfg.val_windows),
        token_bytes=torch.tensor(token_byte_lengths(tokenizer), dtype=torch.float64),
    )
