"""`directory_lock(path)`: an exclusive `flock` on a directory itself, for processes that fill it.

Processes that start together (two server processes, parallel test workers, a `prepare_models`
beside a running server) take turns, and the second finds the first one's work instead of
replacing it under its reader. Locking the directory's own descriptor leaves no lock file behind,
and the kernel releases the lock however the holding process ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on `directory` (made if missing) for the `with` block."""
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock
