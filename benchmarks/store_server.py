"""A PostgreSQL and a PgBouncer for the store benchmarks, kept in a folder between commands.

Debian's packages, started on 127.0.0.1 by tests/support (``PostgresServer``, ``PgBouncer`` in
transaction mode), with durable commits (fsync on, unlike the tests) and a little more memory
than the package's default, as a small production server would have.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.pgbouncer import QUERY_WAIT_TIMEOUT, PgBouncer
from tests.support.ports import free_port
from tests.support.postgres import TEST_ROLE, PostgresServer, find_bin_dir

SETTINGS = (
    "fsync = on",
    "synchronous_commit = on",
    "shared_buffers = 1GB",
    "work_mem = 64MB",
    "max_wal_size = 8GB",
    "max_connections = 120",
)
DATABASE = "profiler"
SERVER_LOGIN_RETRY = 15.0  # PgBouncer's default


@dataclass
class Servers:
    postgres: PostgresServer
    bouncer: PgBouncer

    @property
    def root(self) -> Path:
        return self.postgres.root

    def url(self, *, pooled: bool = False) -> str:
        return self.bouncer.url(DATABASE) if pooled else self.postgres.url(DATABASE)

    def psql(self, sql: str, database: str = DATABASE) -> str:
        completed = subprocess.run(
            [
                *("psql", "-X", "-q", "-At", "-h", "127.0.0.1", "-p", str(self.postgres.port)),
                *("-U", TEST_ROLE, "-d", database, "-v", "ON_ERROR_STOP=1", "-c", sql),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"psql failed: {completed.stderr.strip()[:2000]}")
        return completed.stdout.strip()

    def server_connections(self) -> int:
        """Client backends connected to PostgreSQL now (PgBouncer's and any direct ones)."""
        return int(
            self.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                " AND pid <> pg_backend_pid()"
            )
        )


def start(root: Path, *, pool_size: int = 40, time_scale: float = 1.0) -> Servers:
    """initdb and start PostgreSQL, then PgBouncer with at most ``pool_size`` server
    connections, in ``root`` (which must not exist); an empty database ``profiler``.
    ``time_scale``: PgBouncer's waits are divided by it, for benchmarks on a compressed clock."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
    root.mkdir(parents=True)
    run_as = None
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(root, account.pw_uid, account.pw_gid)
        run_as = "postgres"
    server = PostgresServer(bin_dir=bin_dir, root=root, port=free_port(), run_as=run_as)
    server.start()
    with (server.data_dir / "postgresql.conf").open("a") as conf:
        conf.write("\n".join(SETTINGS) + "\n")
    server.restart()
    bouncer_root = root / "pgbouncer"
    bouncer_root.mkdir()
    if run_as is not None:
        shutil.chown(bouncer_root, run_as, run_as)
    bouncer = PgBouncer(
        server,
        bouncer_root,
        free_port(),
        pool_size,
        query_wait_timeout=QUERY_WAIT_TIMEOUT / time_scale,
        server_login_retry=SERVER_LOGIN_RETRY / time_scale,
    )
    bouncer.start()
    servers = Servers(server, bouncer)
    servers.psql(f"CREATE DATABASE {DATABASE}", database="postgres")
    state = {"port": server.port, "bouncer_port": bouncer.port, "pool_size": pool_size}
    (root / "servers.json").write_text(json.dumps(state))
    return servers


def attach(root: Path) -> Servers:
    """The servers a previous ``start`` left running in ``root``."""
    state = json.loads((root / "servers.json").read_text())
    bin_dir = find_bin_dir()
    assert bin_dir is not None
    run_as = "postgres" if os.geteuid() == 0 else None
    server = PostgresServer(bin_dir=bin_dir, root=root, port=state["port"], run_as=run_as)
    bouncer = PgBouncer(server, root / "pgbouncer", state["bouncer_port"], state["pool_size"])
    return Servers(server, bouncer)


def stop(servers: Servers, *, remove: bool = True) -> None:
    servers.bouncer.stop()
    servers.postgres.stop()
    if remove:
        shutil.rmtree(servers.root, ignore_errors=True)
