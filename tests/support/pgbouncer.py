"""A real PgBouncer (Debian's ``pgbouncer`` package) in transaction mode in front of the test
PostgreSQL (tests/support/postgres.py), on 127.0.0.1 at a free port.

It trusts the test role as the server does, and keeps at most ``pool_size`` server connections
per database. Use the session fixture ``pgbouncer`` (declare ``pytest_plugins =
["tests.support.postgres", "tests.support.pgbouncer"]``), or ``running_pgbouncer`` directly (the
benchmarks). Tests skip with the reason when PgBouncer is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.postgres import TEST_ROLE, PostgresServer

BINARY = Path("/usr/sbin/pgbouncer")
QUERY_WAIT_TIMEOUT = 10  # seconds, as docs/store.md recommends for the pooler
OPEN_FILES = 8192


@dataclass
class PgBouncer:
    server: PostgresServer
    root: Path
    port: int
    pool_size: int
    query_wait_timeout: float = QUERY_WAIT_TIMEOUT
    server_login_retry: float = 15  # PgBouncer's default

    def url(self, database: str) -> str:
        return f"postgresql://{TEST_ROLE}@127.0.0.1:{self.port}/{database}"

    @property
    def pid_file(self) -> Path:
        return self.root / "pgbouncer.pid"

    def start(self) -> None:
        (self.root / "userlist.txt").write_text(f'"{TEST_ROLE}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir = {self.root}\n"
            f"auth_type = trust\nauth_file = {self.root / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\nmax_db_connections = {self.pool_size}\n"
            "max_client_conn = 4000\n"
            # Room for a thousand clients connecting at once (a benchmark's start): the default
            # backlog, 128, drops the rest's SYNs, which then retry seconds later.
            "listen_backlog = 4096\n"
            # A server connection is handed to the next client as it is: nothing to reset in
            # transaction mode, where clients keep no session state.
            "server_reset_query =\n"
            # A client waits this long for a server connection, e.g. while PostgreSQL is down
            # (default 120 s): a daemon's cycle waits no longer than this for its write.
            f"query_wait_timeout = {self.query_wait_timeout:g}\n"
            f"server_login_retry = {self.server_login_retry:g}\n"
            f"logfile = {self.root / 'pgbouncer.log'}\npidfile = {self.pid_file}\n"
        )
        # A file descriptor per client: the login default (1024) would refuse the thousandth.
        command = ["prlimit", f"--nofile={OPEN_FILES}", "--", str(BINARY), "-d"]
        command.append(str(self.root / "pgbouncer.ini"))
        if self.server.run_as is not None:
            command = ["runuser", "-u", self.server.run_as, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while not self.pid_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(self.pid_file.read_text().strip()), signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self.pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def running_pgbouncer(server: PostgresServer, *, pool_size: int = 20) -> Iterator[PgBouncer]:
    if not BINARY.is_file():
        pytest.skip("PgBouncer is not installed (apt-get install pgbouncer)")
    root = server.root / f"pgbouncer-{free_port()}"
    root.mkdir()
    if server.run_as is not None:
        shutil.chown(root, server.run_as, server.run_as)
    bouncer = PgBouncer(server, root, free_port(), pool_size)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    with running_pgbouncer(postgres_server) as bouncer:
        yield bouncer
