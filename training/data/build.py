"""From the ``data`` config to the tokenizer, training batches and fixed validation windows, in two steps:
``open_corpus`` (the splits, read lazily, and the tokenizer: a BPE trained on the training split and cached, or a
given one), then ``tokenize`` (the token arrays, cached); ``build_data`` does both. ``build_validation`` gives
eval.py the validation windows alone, with the checkpoint's tokenizer.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.data.batches import TrainBatches, heldout_windows, validation_windows
from training.data.corpus import Split, load_splits
from training.data.token_cache import token_array
from training.data.tokenizer import get_tokenizer, token_byte_lengths


@dataclass
class Data:
    tokenizer: Tokenizer
    train: TrainBatches
    val: torch.Tensor  # (windows, seq_len + 1) token ids
    token_bytes: torch.Tensor  # UTF-8 bytes per token id, for bits per byte
    heldout: torch.Tensor | None  # windows disjoint from val (data.heldout_windows), or None
    fingerprint: dict[str, str]  # each split's text identity (files' hashes or stats, settings): a resume checks it


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


@dataclass
class Corpus:
    """The splits (their documents read when iterated) and the tokenizer that reads them."""

    train: Split
    val: Split
    tokenizer: Tokenizer


def open_corpus(data_cfg, tokenizer: Tokenizer | None = None) -> Corpus:
    """The corpus ``data_cfg`` names; ``tokenizer``: a given one (train.init_from's source's) instead of the one
    ``data.tokenizer`` names."""
    train_split, val_split = load_splits(data_cfg)
    return Corpus(train_split, val_split, tokenizer or get_tokenizer(data_cfg, train_split, _cache_dir(data_cfg)))


def tokenize(corpus: Corpus, data_cfg, seq_len: int, global_batch: int, seed: int) -> Data:
    """The corpus as token arrays (cached): training batches and the fixed validation (and held-out) windows."""
    cache_dir = _cache_dir(data_cfg)
    train_tokens = token_array(corpus.train, corpus.tokenizer, cache_dir, f"{data_cfg.name}-train")
    val, token_bytes, heldout = _validation(corpus.val, corpus.tokenizer, data_cfg, seq_len, cache_dir)
    batches = TrainBatches(train_tokens, seq_len, global_batch, seed)
    fingerprint = {"train": corpus.train.fingerprint, "val": corpus.val.fingerprint}
    return Data(corpus.tokenizer, batches, val, token_bytes, heldout, fingerprint)


def build_data(data_cfg, seq_len: int, global_batch: int, seed: int, tokenizer: Tokenizer | None = None) -> Data:
    """``open_corpus`` then ``tokenize``."""
    return tokenize(open_corpus(data_cfg, tokenizer), data_cfg, seq_len, global_batch, seed)


def build_validation(data_cfg, seq_len: int, tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(validation windows, bytes per token, what they are: the split's fingerprint and the tokenizer's) with a
    given tokenizer, e.g. a checkpoint's own.

    Only the validation split is tokenized: evaluating on another corpus never pays for its
    training split.
    """
    _, val_split = load_splits(data_cfg)
    windows, token_bytes, _ = _validation(val_split, tokenizer, data_cfg, seq_len, _cache_dir(data_cfg))
    tokenizer_hash = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:12]
    return windows, token_bytes, f"{val_split.fingerprint}|tokenizer {tokenizer_hash}"
