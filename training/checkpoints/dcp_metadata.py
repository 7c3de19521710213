"""A sharded checkpoint's ``.metadata``, read as data: torch.distributed.checkpoint reads it with plain
``pickle.load``, which runs whatever code a crafted file names. Here an unpickler admits the exact (module, name)
pairs of the classes DCP's metadata is made of, and the metadata must describe tensors only, each stored in a
shard file of that checkpoint long enough to hold it. A checkpoint that fails is refused before any tensor is
read, so a run, eval.py and the export fall back to the previous one. Imported only when a .dcp is read."""

from __future__ import annotations

import pickle
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

import torch
from torch.distributed.checkpoint import metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from training.errors import CheckpointError, UnsafeCheckpointError
from training.input_files import InputFileError, regular_file

METADATA = ".metadata"
# Every class DCP's metadata is made of, as the exact (module, name) pairs a pickle names them by. Never a module's
# whole namespace: a module that imports os would hand a crafted pickle os.system through it.
_METADATA_CLASSES = {
    **{
        ("torch.distributed.checkpoint.metadata", cls.__name__): cls
        for cls in (
            metadata.Metadata,
            metadata.MetadataIndex,
            metadata.StorageMeta,
            metadata.TensorProperties,
            metadata.TensorStorageMetadata,
            metadata.ChunkStorageMetadata,
            metadata.BytesStorageMetadata,  # read, then refused: normlab's checkpoints hold tensors only
            metadata._MEM_FORMAT_ENCODING,
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a layout by its name: torch.strided
    **{("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)},
    **{(module, cls.__name__): cls for module in ("pathlib", "pathlib._local") for cls in (PosixPath, PurePosixPath)},
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return _METADATA_CLASSES[module, name]
        raise UnsafeCheckpointError(
            f"refused to read {self.path}: it names {module}.{name}, which torch.distributed.checkpoint's metadata "
            "never holds, and unpickling it could run code; only read it with torch.distributed.checkpoint "
            "itself if you trust whoever made it"
        )


def read_metadata(path: Path) -> Metadata:
    """The metadata of the sharded checkpoint ``path``, read as data only, and checked against the files beside it:
    tensors only, each in a shard file of this checkpoint that is long enough to hold it. A checkpoint that fails
    is refused here, before any tensor is read, so a run falls back to the previous checkpoint."""
    file = Path(path) / METADATA
    try:
        regular_file(file, "a sharded checkpoint's metadata")
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f, file).load()
        shards = _shards_needed(path, metadata)
    except CheckpointError:
        raise
    except InputFileError as err:
        raise CheckpointError(f"could not read checkpoint {path}: {err}") from None
    except Exception as err:  # a pickle of allowed classes in another arrangement is damaged too
        raise CheckpointError(f"could not read checkpoint {path}: {file.name} is damaged ({err})") from None
    for name, end in sorted(shards.items()):
        shard = Path(path) / name
        size = shard.stat().st_size if shard.is_file() else None  # a FIFO or a device is no shard
        if size is None or size < end:
            problem = "is missing" if size is None else f"is truncated ({size:,} of at least {end:,} bytes)"
            raise CheckpointError(f"could not read checkpoint {path}: its shard {name} {problem}")
    return metadata


def _shards_needed(path: Path, metadata: Metadata) -> dict[str, int]:
    """Each shard file the metadata names, with the bytes it must hold; refuses entries that are not tensors and
    files outside the checkpoint."""
    if not isinstance(metadata, Metadata):
        raise TypeError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    entries = metadata.state_dict_metadata
    others = sorted(k for k, v in entries.items() if not isinstance(v, TensorStorageMetadata))
    if others:
        raise UnsafeCheckpointError(
            f"refused to read {path}: it holds non-tensor entries ({', '.join(map(str, others[:3]))}), which "
            "torch.distributed.checkpoint would unpickle; normlab's sharded checkpoints hold tensors only"
        )
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        if not isinstance(info, _StorageInfo):
            raise TypeError(f"a shard entry is a {type(info).__name__}")
        name = info.relative_path
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise UnsafeCheckpointError(f"refused to read {path}: its metadata points outside it ({name!r})")
        needed[name] = max(needed.get(name, 0), int(info.offset) + int(info.length))
    return needed
