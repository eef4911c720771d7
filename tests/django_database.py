"""Pointing Django's default database at another server for a while (the bundled pgvector one).

The suite's database is SQLite or the system PostgreSQL (no pgvector); the pgvector tests need
theirs. The connection settings are one dict shared by every thread's connection, so it is
changed in place (threads that connect meanwhile, like a search running beside a restart, get
the new server), this thread's connection is replaced, and the test database is created there by
Django's own machinery (migrations included; kept between modules).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dj_database_url
from django.db import connections

ALIAS = "default"


@contextmanager
def default_database(url: str) -> Iterator[None]:
    """Run the body with Django's default database on `url`'s server, in a test database."""
    shared = connections.settings[ALIAS]
    saved = dict(shared)
    original = connections[ALIAS]
    original.close()
    configured = connections.configure_settings({ALIAS: dj_database_url.parse(url)})[ALIAS]
    shared.clear()
    shared.update(configured)
    connection = connections.create_connection(ALIAS)
    connections[ALIAS] = connection
    try:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=True)
        yield
    finally:
        connection.close()
        shared.clear()
        shared.update(saved)
        connections[ALIAS] = original
