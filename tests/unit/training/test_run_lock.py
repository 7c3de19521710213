"""training/run/lock.py: who holds a run directory, asked without disturbing a live holder."""

import os

from training.run.lock import LOCK_FILE, RunLock, lock_holder


def test_the_holder_is_named_while_it_trains_and_nobody_before_or_after(tmp_path):
    assert lock_holder(tmp_path) is None  # no lock file yet
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        assert lock_holder(tmp_path).startswith(f"pid {os.getpid()} on ")
    finally:
        lock.release()
    assert lock_holder(tmp_path) is None  # a clean release empties the file


def test_text_left_by_a_killed_process_names_nobody_and_still_lets_the_next_run_in(tmp_path):
    (tmp_path / LOCK_FILE).write_text("pid 1 on elsewhere, since 2026-01-01T00:00:00+00:00: train.py\n")
    assert lock_holder(tmp_path) is None  # the kernel dropped that process's lock; only its text is left
    lock = RunLock(tmp_path)
    lock.acquire()  # the probe let the lock go again
    lock.release()
