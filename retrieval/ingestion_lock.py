"""The per-document ingestion lock: an exclusive `flock` on a file of the document's own.

Every ingestion of a document runs under it (`retrieval.ingest.ingest`), so two runs of one
document never overlap: the second waits for the first. Because the kernel releases an `flock`
however its process ends, a free lock also says that no live process is ingesting the document;
`retrieval.recovery` builds the crash model on that.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings


def lock_path(document_id: int) -> Path:
    directory = Path(settings.DATA_DIR) / "index" / "ingesting"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"document-{int(document_id)}.lock"


@contextlib.contextmanager
def ingestion_lock(document_id: int, *, blocking: bool = True) -> Iterator[bool]:
    """Hold document `document_id`'s ingestion lock; yields False if not blocking and taken.

    The file is removed when released. A waiter that then gets the lock of the removed file
    notices (another inode at the path now) and takes the lock of the path's current file.
    """
    path = lock_path(document_id)
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(descriptor)
            yield False
            return
        except BaseException:
            os.close(descriptor)
            raise
        try:
            is_current = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            is_current = False
        if is_current:
            break
        os.close(descriptor)
    try:
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(descriptor)  # releases the lock
