"""The tokenizer: a byte-level BPE trained on the training split and cached, or a given one.

A trained tokenizer is cached under a key of (corpus fingerprint, vocab size, settings), so
the second run with the same data reuses it instead of training again.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from training.atomic import atomic_write_text
from training.data.corpus import DataError, Split
from training.input_files import InputFileError, MiB, read_text

log = logging.getLogger(__name__)
EOS = "<|endoftext|>"
_BPE_SETTINGS = "byte-level-bpe:v1:add_prefix_space=False"
_MIN_VOCAB = 256 + 1  # every byte, plus the end-of-text token


def get_tokenizer(data_cfg, train: Split, cache_dir: Path) -> Tokenizer:
    """The tokenizer ``data.tokenizer`` names: 'bpe' (trained and cached), a tokenizer.json, or a local HF name."""
    if data_cfg.tokenizer == "bpe":
        tokenizer = _cached_bpe(train, data_cfg.vocab_size, cache_dir)
        learned = tokenizer.get_vocab_size()
        if learned < data_cfg.vocab_size:  # a warning, not a refusal: tests ask small corpora for round sizes
            log.warning(
                f"data.vocab_size={data_cfg.vocab_size}, but the BPE learned only {learned} tokens from this training "
                f"split (no pairs left to merge), so the run trains with {learned}: set "
                f"data.vocab_size<={learned}, or train on more text"
            )
        return tokenizer
    path = Path(os.path.expanduser(data_cfg.tokenizer))
    if path.suffix == ".json":
        if not path.exists():
            raise DataError(f"data.tokenizer={data_cfg.tokenizer!r}: no such file")
        return read_tokenizer_file(
            path, f"data.tokenizer={data_cfg.tokenizer!r}", "give a tokenizer.json that train.py wrote"
        )
    return _local_hf_tokenizer(data_cfg.tokenizer)


def _local_hf_tokenizer(name: str) -> Tokenizer:
    try:
        from huggingface_hub import hf_hub_download

        return Tokenizer.from_file(hf_hub_download(name, "tokenizer.json", local_files_only=True))
    except Exception:
        raise DataError(
            f"data.tokenizer={name!r} is neither 'bpe', a tokenizer.json path, nor a Hugging Face tokenizer "
            "in the local cache. Use data.tokenizer=bpe to train one, or give a path to its tokenizer.json."
        ) from None


def _cached_bpe(train: Split, vocab_size: int, cache_dir: Path) -> Tokenizer:
    if vocab_size < _MIN_VOCAB:
        raise DataError(
            f"data.vocab_size={vocab_size} is too small for a byte-level BPE: it needs at least {_MIN_VOCAB} "
            "(256 byte symbols and the end-of-text token)"
        )
    key = hashlib.sha256(f"{train.fingerprint}|{vocab_size}|{_BPE_SETTINGS}".encode()).hexdigest()[:16]
    path = cache_dir / "tokenizers" / f"bpe-{vocab_size}-{key}.json"
    if path.is_file():
        return read_tokenizer_file(path, "the data cache", "delete it and the next run trains it again")
    tokenizer = train_bpe(train.documents(), vocab_size)
    atomic_write_text(path, tokenizer.to_str())
    return tokenizer


TOKENIZER_LIMIT = 256 * MiB  # Llama 3's tokenizer.json is 9 MB, Gemma 3's 33 MB


def read_tokenizer_file(path: Path, where: str, fix: str) -> Tokenizer:
    """A tokenizer file of bounded size, or one line naming it, what is wrong and ``fix`` (the library's errors are
    bare)."""
    try:
        text = read_text(path, TOKENIZER_LIMIT, where)
    except InputFileError as err:
        raise DataError(f"{err}; {fix}") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as err:
        raise DataError(
            f"{where}: {path} is not a tokenizer file ({' '.join(str(err).split())[:200]}); {fix}"
        ) from None


def train_bpe(documents, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    if tokenizer.get_vocab_size() < _MIN_VOCAB:
        raise DataError("the training split is empty: the tokenizer learned no text (check data.train_files)")
    return tokenizer


def eos_id(tokenizer: Tokenizer) -> int | None:
    return tokenizer.token_to_id(EOS)


def token_byte_lengths(tokenizer: Tokenizer) -> list[int]:
    """UTF-8 bytes each token stands for, so losses convert to bits per byte.

    For a byte-level tokenizer each character of a token's string is one byte; otherwise a
    token is decoded on its own (a piece of a UTF-8 character then counts as the 3 bytes of U+FFFD).
    Special tokens count zero bytes.
    """
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    # Llama 3's, Qwen's and OLMo 2's byte-level BPE split text first (a Sequence pre-tokenizer): the decoder tells
    byte_level = isinstance(tokenizer.pre_tokenizer, pre_tokenizers.ByteLevel) or isinstance(
        tokenizer.decoder, decoders.ByteLevel
    )
    lengths = []
    for i in range(tokenizer.get_vocab_size()):
        token = tokenizer.id_to_token(i)
        if token is None or token in specials:
            lengths.append(0)
        elif byte_level:
            lengths.append(len(token))
        else:
            lengths.append(len(tokenizer.decode([i]).encode("utf-8")))
    return lengths
