"""One writer per run directory: an advisory lock that dies with the process holding it.

``<run dir>/.lock`` is locked with ``flock`` for as long as a process trains there. The kernel
drops the lock when that process exits, however it exits, so a killed run leaves nothing that
blocks the next one. While held, the file's text names the holder (pid, host, start time,
command); a clean release empties it again, so a refused attempt leaves the file as it found
it. A second process is refused at once, without waiting. Under torchrun rank 0 holds the
lock for the whole job.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import socket
import sys
from pathlib import Path

from training.errors import NormlabError

LOCK_FILE = ".lock"


class RunLockedError(NormlabError, RuntimeError):
    """Another live process is training in this run directory."""


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write who holds it, or raise at once, naming the process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"another process is training in {self.path.parent} ({named_holder(self.path)}); a run directory has one "
                "writer at a time. Wait for it to finish or stop it, or start a separate run with run_name=..."
            ) from None
        self.fd = fd
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        text = f"pid {os.getpid()} on {socket.gethostname()}, since {started}: {' '.join(sys.argv)}\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def named_holder(lock: Path) -> str:
    """Who holds ``lock``, as the holder wrote it (empty only in the moment before it writes)."""
    return lock.read_text().strip() or "a process that is still starting"


def lock_holder(run_dir: Path) -> str | None:
    """The process training in ``run_dir`` now, as its lock names it, or None when none is. An empty lock file
    was released cleanly and is not probed; text left by a killed process is probed, briefly taking the lock."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file() or not path.read_text().strip():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return named_holder(path)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def discard_unused(run_dir: Path) -> None:
    """Remove a run directory that this process found empty and wrote nothing into but its (released, empty)
    lock: a refused command leaves no directory behind."""
    lock = Path(run_dir) / LOCK_FILE
    if lock.is_file() and lock.stat().st_size == 0:
        lock.unlink()
    if Path(run_dir).is_dir() and not any(Path(run_dir).iterdir()):
        Path(run_dir).rmdir()
