"""A real PostgreSQL server for the tests of the shared queue: Debian's ``postgresql``
package (installed by ``.ci/deps``), a cluster made with ``initdb`` in a temporary folder
as the ``postgres`` user (initdb refuses root), listening on a Unix socket only, stopped
and removed at the end. Never a mock."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_postgres(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    runner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run([*runner, *argv], capture_output=True, text=True, timeout=timeout,
                          check=False)


class PostgresServer:
    """One running cluster: its socket folder, and databases made on demand."""

    def __init__(self, folder: Path, binaries: Path) -> None:
        self.folder = folder
        self.binaries = binaries
        self.data = folder / "data"
        self.socket_dir = folder / "sock"

    def start(self) -> None:
        done = _as_postgres(str(self.binaries / "initdb"), "-D", str(self.data), "-A", "trust",
                            "-U", "postgres", "--no-sync", "-E", "UTF8")
        if done.returncode != 0:
            pytest.fail(f"initdb failed: {done.stderr.strip()}")
        self.socket_dir.mkdir()
        shutil.chown(self.socket_dir, "postgres", "postgres")
        self.start_again()

    def start_again(self) -> None:
        """Start the stopped cluster again (its data kept)."""
        options = (f"-c listen_addresses='' -c unix_socket_directories='{self.socket_dir}' "
                   "-c fsync=on -c max_connections=200")
        done = _as_postgres(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-w", "-t",
                            "60", "-o", options, "-l", str(self.folder / "log"), "start",
                            timeout=90)
        if done.returncode != 0:
            log = (self.folder / "log").read_text() if (self.folder / "log").exists() else ""
            pytest.fail(f"pg_ctl start failed: {done.stderr.strip()} {log[-2000:]}")

    def stop(self) -> None:
        _as_postgres(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                     "stop", timeout=60)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def new_database(self) -> str:
        """A new empty database; its URL."""
        name = "capd_" + uuid.uuid4().hex[:12]
        done = _as_postgres(str(self.binaries / "createdb"), "-h", str(self.socket_dir), "-U",
                            "postgres", name)
        if done.returncode != 0:
            pytest.fail(f"createdb failed: {done.stderr.strip()}")
        return self.url(name)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A running PostgreSQL cluster for the length of the block; skipped where Debian's
    package is missing (``.ci/deps`` installs it) or no ``postgres`` user exists."""
    binaries = _binaries()
    if binaries is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/deps does)")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user to run initdb as (the postgresql package makes it)")
    folder = Path(tempfile.mkdtemp(prefix="capd-pg-", dir="/tmp"))
    folder.chmod(0o755)
    shutil.chown(folder, "postgres", "postgres")
    server = PostgresServer(folder, binaries)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


NewDatabase = Callable[[], str]
