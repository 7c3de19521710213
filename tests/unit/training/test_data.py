"""The data pipeline, offline: default corpus, tokenizer and token caches, batches, bad input."""

import dataclasses
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from training.config import ConfigError, DataConfig
from training.data.batches import TrainBatches, heldout_windows, split_global_batch, validation_windows
from training.data.build import build_data
from training.data.corpus import DataError, load_splits
from training.data.token_cache import cache_key, token_array
from training.data.tokenizer import get_tokenizer, token_byte_lengths, train_bpe


@pytest.fixture(scope="session")
def kjv_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("normlab-cache"))


def test_kjv_loads_and_splits_by_book(kjv_cache):
    cfg = DataConfig(cache_dir=kjv_cache)
    train, val = load_splits(cfg)
    val_docs = list(val.documents())
    assert val_docs[0].startswith("Now it came to pass in the days when the judges ruled")  # Ruth 1:1
    assert any(doc.startswith("The beginning of the gospel of Jesus Christ") for doc in val_docs)  # Mark 1:1
    train_text = "\n".join(train.documents())
    assert train_text.startswith("In the beginning God created the heaven and the earth.")
    assert "The beginning of the gospel of Jesus Christ" not in train_text  # Mark is held out whole
    assert len(val_docs) == 4 + 12 + 16 + 4 + 1  # chapters of Ruth, Ecclesiastes, Mark, Philippians, Jude


def test_build_data_end_to_end_and_tokenizer_cache_hit(kjv_cache, monkeypatch):
    data = build_data(DataConfig(cache_dir=kjv_cache), seq_len=64, global_batch=8, seed=0)
    assert data.tokenizer.get_vocab_size() == 4096
    assert data.val.shape == (64, 65) and data.train.tokens.dtype == np.uint16

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been reused")

    monkeypatch.setattr("training.data.tokenizer.train_bpe", no_training)
    again = build_data(DataConfig(cache_dir=kjv_cache), seq_len=64, global_batch=8, seed=0)
    assert again.tokenizer.to_str() == data.tokenizer.to_str()
    assert torch.equal(again.val, data.val)
    assert len(os.listdir(os.path.join(kjv_cache, "tokenizers"))) == 1


def test_bits_per_byte_table_counts_utf8_bytes():
    tokenizer = train_bpe(["héllo wörld " * 50, "abc def"], vocab_size=300)
    lengths = token_byte_lengths(tokenizer)
    text = "héllo wörld abc"
    ids = tokenizer.encode(text).ids
    assert sum(lengths[i] for i in ids) == len(text.encode("utf-8"))
    assert lengths[tokenizer.token_to_id("<|endoftext|>")] == 0


def _files_cfg(tmp_path, train_text, val_text=None, **kw):
    (tmp_path / "train.txt").write_text(train_text)
    val_files = []
    if val_text is not None:
        (tmp_path / "val.txt").write_text(val_text)
        val_files = [str(tmp_path / "val.txt")]
    settings = dict(
        source="text_files",
        name="files",
        train_files=[str(tmp_path / "train.txt")],
        val_files=val_files,
        cache_dir=str(tmp_path / "cache"),
        vocab_size=300,
    )
    return DataConfig(**{**settings, **kw})


def test_memmap_round_trip_and_new_key_when_tokenizer_changes(tmp_path):
    cfg = _files_cfg(tmp_path, "one two three\n\nfour five six\n\nseven", "eight nine")
    train, _ = load_splits(cfg)
    tokenizer = get_tokenizer(cfg, train, tmp_path / "cache")
    tokens = token_array(train, tokenizer, tmp_path / "cache", "t")
    eos = tokenizer.token_to_id("<|endoftext|>")
    docs = np.split(np.asarray(tokens), np.where(np.asarray(tokens) == eos)[0] + 1)[:-1]
    decoded = [tokenizer.decode(d[:-1].tolist()) for d in docs]
    assert decoded == ["one two three", "four five six", "seven"]

    other = train_bpe(["a different corpus gives different merges"], vocab_size=300)
    assert other.to_str() != tokenizer.to_str()
    assert cache_key(train, other) != cache_key(train, tokenizer)
    assert cache_key(train, train_bpe(train.documents(), vocab_size=300)) == cache_key(train, tokenizer)
    (tmp_path / "train.txt").write_text("changed text entirely")
    changed, _ = load_splits(cfg)
    assert changed.fingerprint != train.fingerprint


def test_text_files_with_split_fraction(tmp_path):
    text = "\n\n".join(f"paragraph number {i} with some words" for i in range(40))
    cfg = _files_cfg(tmp_path, text, val_fraction=0.1)
    train, val = load_splits(cfg)
    assert len(list(train.documents())) == 36 and list(val.documents())[0].startswith("paragraph number 36")


def test_jsonl_files_and_missing_text_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"text {i}"}) for i in range(10)))
    cfg = DataConfig(source="text_files", train_files=[str(path)], cache_dir=str(tmp_path), text_field="body")
    train, _ = load_splits(cfg)
    assert next(iter(train.documents())) == "text 0"
    with pytest.raises(DataError, match=r"data.text_field='text' is not a column.*\['body'\]"):
        load_splits(DataConfig(source="text_files", train_files=[str(path)], cache_dir=str(tmp_path)))


def test_batches_are_deterministic_per_seed_and_step():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = TrainBatches(tokens, seq_len=16, global_batch=8, seed=1)
    b = TrainBatches(tokens, seq_len=16, global_batch=8, seed=1)
    assert torch.equal(a.get(5, 0, 8)[0], b.get(5, 0, 8)[0])
    assert not torch.equal(a.get(5, 0, 8)[0], a.get(6, 0, 8)[0])
    assert not torch.equal(a.get(5, 0, 8)[0], TrainBatches(tokens, 16, 8, seed=2).get(5, 0, 8)[0])
    inputs, targets = a.get(3, 0, 8)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are inputs shifted by one


def test_split_global_batch():
    unset = SimpleNamespace(global_batch_tokens=None, batch_size=4)
    assert split_global_batch(unset, 64, 1) == (4, 1)
    assert split_global_batch(unset, 64, 2) == (8, 1)  # unset: one micro-batch per process, whatever their count
    fixed = SimpleNamespace(global_batch_tokens=64 * 16, batch_size=4)
    assert split_global_batch(fixed, 64, 1) == (16, 4)
    assert split_global_batch(fixed, 64, 2) == (16, 2)


def test_a_global_batch_that_does_not_split_names_the_values_that_would():
    """6 sequences over 2 processes is 3 each: batch sizes 1 and 3 split them, and 512 tokens (64 x 4 x 2) would
    split into micro-batches of 4; 1000 tokens are no whole number of sequences, so only the global batch can move."""
    with pytest.raises(ConfigError) as refused:
        split_global_batch(SimpleNamespace(global_batch_tokens=64 * 6, batch_size=4), 64, 2)
    assert str(refused.value) == (
        "train.global_batch_tokens=384 is 3 sequences of 64 tokens for each of 2 process(es), which micro-batches "
        "of train.batch_size=4 do not split: set train.batch_size to a divisor of 3 (1, 3), or "
        "train.global_batch_tokens to a multiple of 512 = 64 tokens x 4 x 2 process(es), e.g. 512, or to null "
        "(one micro-batch per process)"
    )
    for batch_size in (1, 3):
        assert split_global_batch(SimpleNamespace(global_batch_tokens=384, batch_size=batch_size), 64, 2)[0] == 6
    with pytest.raises(ConfigError, match=r"no train.batch_size splits it: .* multiple of 512 .* e.g. 512 or 1024,"):
        split_global_batch(SimpleNamespace(global_batch_tokens=1000, batch_size=4), 64, 2)
    with pytest.raises(ConfigError, match=r"a divisor of 720 \(4, 5, 6, 8, 9, 10\)"):  # the six nearest to 7
        split_global_batch(SimpleNamespace(global_batch_tokens=64 * 720, batch_size=7), 64, 1)


def test_ranks_slices_union_is_the_single_process_batch():
    tokens = np.arange(10_000, dtype=np.uint16)
    batches = TrainBatches(tokens, seq_len=16, global_batch=8, seed=0)
    whole = batches.get(7, 0, 8)[0]
    per_rank = torch.cat([batches.get(7, rank * 4, 4)[0] for rank in range(2)])
    assert torch.equal(whole, per_rank)


def test_validation_windows_are_fixed_and_cover_the_split():
    tokens = np.arange(1000, dtype=np.uint16)
    windows = validation_windows(tokens, 10, 5)
    assert windows[0, 0] == 0 and windows[-1, -1] == 999
    assert torch.equal(windows, validation_windows(tokens, 10, 5))


@pytest.mark.parametrize(
    "cfg_kw, message",
    [
        ({"source": "text_files", "train_files": ["/nonexistent/*.txt"]}, "no file matches"),
        ({"source": "text_files"}, "needs data.train_files"),
        ({"source": "nope"}, "data.source='nope' is not one of"),
        ({"kjv_val_books": ["Hezekiah"]}, "data.kjv_val_books must name books"),
        ({"source": "hf"}, "needs data.hf_path"),
        ({"source": "hf", "hf_path": "x/y", "streaming": True}, "needs data.max_documents"),
    ],
)
def test_bad_data_config(tmp_path, cfg_kw, message):
    with pytest.raises(DataError, match=message):
        load_splits(DataConfig(cache_dir=str(tmp_path), **cfg_kw))


def test_empty_corpus(tmp_path):
    cfg = _files_cfg(tmp_path, "", "some validation text")
    with pytest.raises(DataError, match="empty|no text"):
        build_data(cfg, seq_len=8, global_batch=2, seed=0)


def test_vocab_too_small_for_bytes(tmp_path):
    cfg = _files_cfg(tmp_path, "some text here", "more", vocab_size=100)
    with pytest.raises(DataError, match="data.vocab_size=100 is too small.*at least 257"):
        build_data(cfg, seq_len=8, global_batch=2, seed=0)


def test_a_vocabulary_the_corpus_cannot_fill_is_named_in_one_warning(tmp_path, caplog):
    """Three short paragraphs give 257 bytes and EOS plus a few merges, far below 300: said once per run, cached
    or not (a warning, as the tests here ask small corpora for 300 tokens)."""
    cfg = _files_cfg(tmp_path, "one two three\n\nfour five six\n\nseven", "eight nine")
    train, _ = load_splits(cfg)
    for _ in ("trained", "cached"):
        caplog.clear()
        learned = get_tokenizer(cfg, train, tmp_path / "cache").get_vocab_size()
        assert 257 < learned < 300
        assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
            f"data.vocab_size=300, but the BPE learned only {learned} tokens from this training split (no pairs left "
            f"to merge), so the run trains with {learned}: set data.vocab_size<={learned}, or train on more text"
        ]
    caplog.clear()
    get_tokenizer(dataclasses.replace(cfg, vocab_size=learned), train, tmp_path / "cache")  # asking for what it has
    assert not caplog.records


def test_seq_len_longer_than_validation_split(tmp_path):
    cfg = _files_cfg(tmp_path, "word " * 2000, "tiny validation")
    with pytest.raises(DataError, match="validation split has .* tokens, fewer than train.seq_len"):
        build_data(cfg, seq_len=64, global_batch=2, seed=0)


def test_unreachable_hub_fails_fast_with_a_clear_message(tmp_path):
    """A fresh process with HF_DATASETS_OFFLINE=1: the error names the dataset and the local-files fix."""
    code = (
        "from training.config import DataConfig\n"
        "from training.data.corpus import load_splits\n"
        f"load_splits(DataConfig(source='hf', hf_path='roneneldan/TinyStories', cache_dir={str(tmp_path)!r}))\n"
    )
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert time.perf_counter() - started < 30
    assert result.returncode != 0
    assert "roneneldan/TinyStories" in result.stderr and "data=text_files" in result.stderr


def test_heldout_windows_are_disjoint_from_the_selection_windows():
    tokens = np.arange(10_000, dtype=np.uint16)  # token i sits at position i: a window's tokens are its positions
    selection = validation_windows(tokens, 63, 16)
    heldout = heldout_windows(tokens, 63, 8, 16)
    assert heldout.shape == (8, 64)
    assert not set(selection.flatten().tolist()) & set(heldout.flatten().tolist())
    assert all((row[1:] - row[:-1] == 1).all() for row in heldout)  # contiguous windows of the split
    with pytest.raises(DataError, match="at most val_windows - 1"):
        heldout_windows(tokens, 63, 16, 16)
    with pytest.raises(DataError, match="cannot hold data.heldout_windows=4"):
        heldout_windows(np.arange(400, dtype=np.uint16), 63, 4, 5)  # 5 windows of 64 in 400 tokens: no room between
