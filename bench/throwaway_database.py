"""A PostgreSQL database a bench creates, fills and drops, so it never touches real data.

On the server of a given URL, or, without one, on the bundled PostgreSQL with pgvector
(`harness.bundled_postgres`), started for the bench and stopped after it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse, urlunparse

logger = logging.getLogger(__name__)


def database_url(server_url: str, name: str) -> str:
    """`server_url` with its database replaced by `name`."""
    return urlunparse(urlparse(server_url)._replace(path=f"/{name}"))


@contextmanager
def throwaway_database(name: str, server_url: str | None = None) -> Iterator[str]:
    """A new, empty database `name` (one left by an interrupted run is dropped first); yields its
    URL and drops it afterwards, closing this process's Django connections to it first."""
    import psycopg

    server = None
    if server_url is None:
        from harness.bundled_postgres import start_bundled_postgres

        server = start_bundled_postgres()
        server_url = server.url()
    admin_url = database_url(server_url, "postgres")

    def admin(statement: str) -> None:
        with psycopg.connect(admin_url, autocommit=True) as connection:
            connection.execute(statement)

    try:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin(f"CREATE DATABASE {name}")
        try:
            yield database_url(server_url, name)
        finally:
            from django.conf import settings
            from django.db import connections

            if settings.configured:
                connections.close_all()
            # NOTE: WITH (FORCE): a worker killed mid-task may leave a connection behind.
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        if server is not None:
            server.close()
