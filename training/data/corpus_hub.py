"""The ``hf`` source: a Hugging Face hub dataset (``data=hf data.hf_path=...``), streamed or cached."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from training.data.corpus import DataError, Split, texts


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


def hub_splits(data_cfg) -> tuple[Split, Split]:
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
        Split(texts(train, data_cfg.text_field, data_cfg.hf_path), f"{base}:{data_cfg.hf_train_split}:{version}"),
        Split(texts(val, data_cfg.text_field, data_cfg.hf_path), f"{base}:{data_cfg.hf_val_split}"),
    )
