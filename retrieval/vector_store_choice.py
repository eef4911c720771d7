"""Which vector store a process uses (`retrieval.vector_store`): faiss or pgvector, and why.

`CACHET_VECTOR_STORE=auto` (the default) takes pgvector when the database is PostgreSQL and the
`vector` extension (0.8 or later: iterative index scans) is installed or can be created, faiss
otherwise; the reason is kept and shown in /healthz. `faiss` or `pgvector` forces one (pgvector
then fails start-up with the reason if it cannot be used).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from django.db import DatabaseError, connections, transaction

from retrieval.index import VectorIndex
from retrieval.pgvector_store import PgVectorStore
from retrieval.vector_store import VectorStore

logger = logging.getLogger(__name__)

STORE_CHOICES = ("auto", "faiss", "pgvector")
# Iterative index scans (filtered HNSW searches that keep looking until `limit` rows pass the
# filter) came with pgvector 0.8.0; older versions return too few rows under a narrow filter.
MIN_PGVECTOR_VERSION = (0, 8, 0)


@dataclass(frozen=True, slots=True)
class StoreChoice:
    name: str  # "faiss" or "pgvector"
    reason: str  # why, for the log and /healthz


def choose_vector_store(requested: str, alias: str = "default") -> StoreChoice:
    """Which store `requested` (auto / faiss / pgvector) means on this database.

    May create the `vector` extension (`CREATE EXTENSION IF NOT EXISTS vector`), which needs a
    role allowed to (a superuser, or the database owner where the extension is trusted).
    Raises ValueError for a forced `pgvector` that cannot be used.
    """
    if requested not in STORE_CHOICES:
        raise ValueError(
            f"unknown vector store {requested!r}; expected one of {', '.join(STORE_CHOICES)}"
        )
    if requested == "faiss":
        return StoreChoice("faiss", "CACHET_VECTOR_STORE=faiss")
    problem = pgvector_problem(alias)
    if problem is None:
        return StoreChoice("pgvector", "PostgreSQL with the vector extension")
    if requested == "pgvector":
        raise ValueError(f"CACHET_VECTOR_STORE=pgvector, but {problem}")
    return StoreChoice("faiss", f"pgvector not used: {problem}")


def pgvector_problem(alias: str = "default") -> str | None:
    """Why pgvector cannot be used on the database `alias`; None when it can (installed now)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return f"the database is {connection.display_name}, not PostgreSQL"
    row = _vector_extension(alias)
    if row is None:
        return (
            "this PostgreSQL server has no vector extension (install pgvector: "
            "postgresql-NN-pgvector from your distribution or PGDG)"
        )
    default_version, installed_version = row
    if installed_version is None:
        try:
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except DatabaseError as error:
            # NOTE: another process starting beside this one may have created it meanwhile
            # (this one then fails on the catalog's unique name): it is there, use it.
            row = _vector_extension(alias)
            if row is not None and row[1] is not None:
                return _version_problem(row[1])
            return (
                f"the vector extension is available but not installed in this database, and "
                f"this role may not create it ({str(error).strip()}); run "
                f"`CREATE EXTENSION vector;` as a superuser"
            )
        installed_version = default_version
    return _version_problem(installed_version)


def _vector_extension(alias: str) -> tuple[str, str | None] | None:
    """(default version, installed version or None) of the vector extension; None without it."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT default_version, installed_version FROM pg_available_extensions "
            "WHERE name = 'vector'"
        )
        row = cursor.fetchone()
    return None if row is None else (str(row[0]), None if row[1] is None else str(row[1]))


def _version_problem(installed_version: str) -> str | None:
    if _version(installed_version) < MIN_PGVECTOR_VERSION:
        return (
            f"pgvector {installed_version} is installed; iterative index scans need 0.8.0 or "
            f"later (`ALTER EXTENSION vector UPDATE;` after upgrading the package)"
        )
    return None


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def make_vector_store(
    choice: StoreChoice, dimension: int, embedding_model: str, faiss_path: Path
) -> VectorStore:
    """The store `choice` names, for vectors of `embedding_model`; creates pgvector's schema."""
    store: VectorStore
    if choice.name == "pgvector":
        store = PgVectorStore(dimension, embedding_model)
    else:
        store = VectorIndex(faiss_path, dimension, embedding_model)
    store.reason = choice.reason
    logger.info("vector store: %s (%s)", store.describe(), choice.reason)
    return store
