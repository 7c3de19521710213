"""Files that come from users are input: each is a regular file, and none is read past a size stated first.

A FIFO or a device (``/dev/zero``) never ends, and a link may lead to either; a small config can name a large
file. So every read of a user's file here first checks that the path (followed through its links) is a regular
file of at most ``limit`` bytes, refuses in one line naming the file, what it is and the bound, and then reads at
most that many bytes, so a file that grows meanwhile cannot make the read unbounded either.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from training.errors import NormlabError

MiB = 2**20
_KINDS = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a device", stat.S_ISBLK: "a device",
          stat.S_ISSOCK: "a socket"}  # fmt: skip


class InputFileError(NormlabError, ValueError):
    """A file that is not one to read: not a regular file, too large, or not what it should hold."""


def _size(count: int) -> str:
    return f"{count / MiB:,.1f} MiB" if count >= MiB else f"{count:,} bytes"


def regular_file(path: Path | str, what: str) -> int:
    """The size of ``path``, refusing anything that is not a regular file (after its links), in one line."""
    path = Path(path)
    try:
        mode = os.stat(path)  # follows links: what a read would open
    except FileNotFoundError:
        dangling = f" (a link to {os.readlink(path)}, which does not exist)" if path.is_symlink() else ""
        raise InputFileError(f"{what}: {path} does not exist{dangling}") from None
    except OSError as err:
        raise InputFileError(f"{what}: {path} cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(mode.st_mode):
        kind = next((name for test, name in _KINDS.items() if test(mode.st_mode)), "not a regular file")
        link = f" (through the link {path})" if path.is_symlink() else ""
        raise InputFileError(f"{what}: {path} is {kind}{link}, not a regular file: give a file")
    return mode.st_size


def read_bytes(path: Path | str, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``; larger is refused before anything is read."""
    size = regular_file(path, what)
    if size > limit:
        raise InputFileError(f"{what}: {path} is {_size(size)}, more than the {_size(limit)} such a file may have")
    try:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except OSError as err:
        raise InputFileError(f"{what}: {path} cannot be read ({err.strerror})") from None
    if len(data) > limit:
        raise InputFileError(f"{what}: {path} grew past {_size(limit)} while it was read")
    return data


def read_text(path: Path | str, limit: int, what: str) -> str:
    """A bounded UTF-8 text file (``read_bytes``), refusing another encoding in one line."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(f"{what}: {path} is not UTF-8 text (byte {err.start} cannot be decoded)") from None


def read_json(path: Path | str, limit: int, what: str) -> Any:
    """A bounded JSON file, its syntax errors in one line."""
    text = read_text(path, limit, what)
    try:
        return json.loads(text)
    except ValueError as err:
        raise InputFileError(f"{what}: {path} is not JSON ({err})") from None
