"""A real, throwaway PostgreSQL server for tests (Debian's ``postgresql`` package).

``initdb`` + ``pg_ctl`` in a temporary directory: listens on 127.0.0.1 at a free port only, its
unix socket in the same directory (settings appended to its postgresql.conf), trust
authentication for the test role. initdb refuses to run as root, so under root the server runs
as the ``postgres`` system user that the package creates.
Use it as the session fixture ``postgres_server``, or ``store_url`` for a fresh empty store on
each backend (SQLite file; PostgreSQL database, marked ``integration``). Declare ``pytest_plugins =
["tests.support.postgres"]`` in the test module. Tests skip with the reason when PostgreSQL is not
installed. fsync is off: the tests kill clients, never the machine.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import free_port

TEST_ROLE = "profiler_test"
_SERVER_USER = "postgres"


def find_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
    )
    for candidate in reversed(candidates):
        bin_dir = Path(candidate)
        if (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file():
            return bin_dir
    return None


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path
    port: int
    run_as: str | None  # system user when we are root

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{TEST_ROLE}@127.0.0.1:{self.port}/{database}"

    def _command(self, *args: str) -> list[str]:
        if self.run_as is None:
            return list(args)
        return ["runuser", "-u", self.run_as, "--", *args]

    def _run(self, *args: str) -> None:
        completed = subprocess.run(
            self._command(*args), capture_output=True, text=True, check=False, timeout=120
        )
        if completed.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{completed.stdout}{completed.stderr}")

    def start(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "--pgdata",
            str(self.data_dir),
            "--username",
            TEST_ROLE,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-sync",
        )
        settings = (
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.root}'",
            "fsync = off",
        )
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(settings) + "\n")
        self.resume()

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run(
                str(self.bin_dir / "pg_ctl"),
                "--pgdata",
                str(self.data_dir),
                "--mode",
                "immediate",
                "--wait",
                "stop",
            )

    def restart(self) -> None:
        """Stop and start again (same port): what clients see when the database restarts."""
        self.stop()
        self.resume()

    def resume(self) -> None:
        """Start a stopped server again with its data and port."""
        self._run(
            str(self.bin_dir / "pg_ctl"),
            "--pgdata",
            str(self.data_dir),
            "--log",
            str(self.root / "server.log"),
            "--wait",
            "--timeout",
            "60",
            "start",
        )

    def create_database(self) -> str:
        """A fresh empty database; returns its URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._run(
            str(self.bin_dir / "createdb"),
            "--host",
            str(self.root),
            "--port",
            str(self.port),
            "--username",
            TEST_ROLE,
            name,
        )
        return self.url(name)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    run_as: str | None = None
    root = Path(tempfile.mkdtemp(prefix="profiler-pg-"))
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam(_SERVER_USER)
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no 'postgres' user to run initdb as")
        os.chown(root, account.pw_uid, account.pw_gid)
        run_as = _SERVER_USER
    server = PostgresServer(bin_dir=bin_dir, root=root, port=free_port(), run_as=run_as)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of a fresh, empty store: a SQLite file, or a new database on the test server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store' / 'profiler.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()
