"""A search store's database not answering (restarting, unreachable): one clear error, and a
connection that the next search opens afresh."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections


class LexicalStoreUnavailable(Exception):
    """The keyword (BM25) store could not answer (its database is down or restarting); nothing
    was changed. (The vector store's is `vector_store.VectorStoreUnavailable`.)"""


@contextmanager
def reported_as(
    error_type: type[Exception], what: str, alias: str = DEFAULT_DB_ALIAS
) -> Iterator[None]:
    """Raise `error_type` ("the <what> could not reach PostgreSQL: ...") for the database
    errors of a connection that is gone; other errors pass unchanged.

    NOTE: outside a caller's transaction the dead connection is closed at once, so the next
    search connects again instead of failing on the closed one ("connection already closed")
    until something else closes it; inside one, the caller's transaction owns it.
    """
    try:
        yield
    except (OperationalError, InterfaceError) as error:
        connection = connections[alias]
        if not connection.in_atomic_block:
            connection.close()
        raise error_type(f"the {what} could not reach PostgreSQL: {str(error).strip()}") from error
