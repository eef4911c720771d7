"""directory_lock: one holder at a time across processes, nothing left in the directory."""

from __future__ import annotations

import subprocess
import sys

from inference.directory_lock import directory_lock

# Another process tries the lock without waiting: prints "taken" or "free".
TRY_LOCK = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print("taken")
else:
    print("free")
"""


def lock_seen_by_another_process(directory) -> str:
    run = subprocess.run(
        [sys.executable, "-c", TRY_LOCK, str(directory)], capture_output=True, text=True, check=True
    )
    return run.stdout.strip()


def test_another_process_finds_the_directory_locked_until_the_block_ends(tmp_path) -> None:
    models_dir = tmp_path / "models"
    with directory_lock(models_dir):
        assert models_dir.is_dir()
        assert lock_seen_by_another_process(models_dir) == "taken"
    assert lock_seen_by_another_process(models_dir) == "free"
    assert list(models_dir.iterdir()) == []


def test_the_lock_is_released_when_the_block_raises(tmp_path) -> None:
    try:
        with directory_lock(tmp_path):
            raise KeyError("conversion failed")
    except KeyError:
        pass
    assert lock_seen_by_another_process(tmp_path) == "free"
