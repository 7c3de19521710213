"""Tokenized splits stored once as memory-mapped arrays, keyed by (text, tokenizer).

The key hashes the split's fingerprint and the tokenizer's full JSON, so a changed corpus
or tokenizer means a new file, never a stale one. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from training.atomic import atomic_write
from training.data.corpus import DataError, Split
from training.data.tokenizer import eos_id

_DOCS_PER_BATCH = 1024


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def cache_key(split: Split, tokenizer: Tokenizer) -> str:
    tokenizer_hash = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    return hashlib.sha256(f"{split.fingerprint}|{tokenizer_hash}".encode()).hexdigest()[:20]


def token_array(split: Split, tokenizer: Tokenizer, cache_dir: Path, label: str) -> np.ndarray:
    """The split's tokens (each document followed by end-of-text) as a read-only memmap."""
    dtype = token_dtype(tokenizer.get_vocab_size())
    path = Path(cache_dir) / "tokens" / f"{label}-{cache_key(split, tokenizer)}.{dtype.name}"
    if not path.is_file():
        atomic_write(path, lambda tmp: _tokenize_into(tmp, split, tokenizer, dtype, label))
    if path.stat().st_size == 0:
        raise DataError(f"the {label} split has no text; check the data config's files, split or text_field")
    return np.memmap(path, dtype=dtype, mode="r")


def _tokenize_into(tmp: str, split: Split, tokenizer: Tokenizer, dtype: np.dtype, label: str) -> None:
    eos = eos_id(tokenizer)
    documents = iter(split.documents())
    with open(tmp, "wb") as out, tqdm(desc=f"tokenizing {label}", unit=" docs", leave=False) as progress:
        while batch := list(itertools.islice(documents, _DOCS_PER_BATCH)):
            # encode_batch tokenizes the batch on all cores (Rust threads).
            for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
                ids = encoding.ids if eos is None else [*encoding.ids, eos]
                out.write(np.asarray(ids, dtype=dtype).tobytes())
            progress.update(len(batch))
