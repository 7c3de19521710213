"""The ``text_files`` source: local .txt or .jsonl files, globs allowed (``data=text_files``)."""

from __future__ import annotations

import codecs
import glob
import hashlib
import os
from pathlib import Path

from training.data.corpus import DataError, Split, texts
from training.input_files import InputFileError, regular_file


def _expand(patterns: list[str], key: str) -> list[str]:
    paths: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise DataError(f"{key}: no file matches {pattern!r} (working directory: {os.getcwd()})")
        folder = next((m for m in matches if os.path.isdir(m)), None)
        if folder is not None:
            raise DataError(f"{key}: {folder} is a folder, not a file; name its files, e.g. {key}=['{folder}/*.txt']")
        for match in matches:  # a FIFO or a device would be read forever
            try:
                regular_file(match, key)
            except InputFileError as err:
                raise DataError(str(err)) from None
        paths.extend(matches)
    return paths


def check_text(path: str, key: str) -> None:
    """Refuse a file that is not UTF-8 text (binary content, another encoding), naming it, where and why."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            if (nul := chunk.find(b"\x00")) >= 0:
                raise DataError(f"{key}: {path} is binary, not text (a NUL byte at offset {offset + nul}); remove it")
            try:
                decoder.decode(chunk, final=len(chunk) < 1 << 20)
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{key}: {path} is not UTF-8 text (byte {offset + err.start} cannot be decoded); convert it, "
                    "e.g. iconv -f latin1 -t utf-8"
                ) from None
            offset += len(chunk)


def _local_dataset(paths: list[str], data_cfg, key: str):
    import datasets

    for path in paths:
        check_text(path, key)
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


def text_file_splits(data_cfg) -> tuple[Split, Split]:
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
        Split(texts(train, field, "data.train_files"), f"files:{fingerprint}:train"),
        Split(texts(val, field, "data.val_files"), f"files:{fingerprint}:val"),
    )
