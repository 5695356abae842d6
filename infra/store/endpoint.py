"""A PostgreSQL store as its clients see it, and the stores the profiler DaemonSet can be given.

The profiler, ``gpu-profiler report`` and Grafana all reach a PostgreSQL store the same way: a host
and port, one database, a user whose password comes from a Secret, and ``sslmode=verify-full``
against the CA that signs the server's certificate. The password is never part of a URL: libpq
reads it from ``PGPASSWORD``, which the pods take from a Secret.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

DATABASE = "gpu_profiler"
WRITER_USER = "gpu_profiler"  # the daemons: owns the database and its tables (migrations)
READER_USER = "gpu_profiler_reader"  # report, Grafana: pg_read_all_data, nothing else
POSTGRESQL_PORT = 5432
# Every namespace that holds a copy of the CA keeps it in this ConfigMap, under this key.
CA_CONFIG_MAP = "gpu-profiler-store-ca"
CA_KEY = "ca.crt"
# Where a password Secret keeps it (kubernetes.io/basic-auth: `username`, `password`).
PASSWORD_KEY = "password"  # noqa: S105  a key name
USERNAME_KEY = "username"


@dataclass(frozen=True)
class DatabaseUser:
    """A login role and its password (a Pulumi secret)."""

    name: str
    password: pulumi.Output[str]


@dataclass(frozen=True)
class StoreEndpoint:
    """Where a PostgreSQL store listens and how its clients authenticate and verify it."""

    host: pulumi.Input[str]
    port: int
    database: str
    writer: DatabaseUser
    reader: DatabaseUser
    # PEM of the CA that signs the server's certificate: sslmode=verify-full checks the chain and
    # that ``host`` is one of the certificate's names.
    ca_certificate: pulumi.Input[str]


def libpq_url(endpoint: StoreEndpoint, user: str, ca_file: str) -> pulumi.Output[str]:
    """``postgresql://user@host:port/database?sslmode=verify-full&sslrootcert=...``, no password."""
    return pulumi.Output.concat(
        "postgresql://",
        user,
        "@",
        endpoint.host,
        f":{endpoint.port}/{endpoint.database}?sslmode=verify-full&sslrootcert={ca_file}",
    )


@dataclass(frozen=True)
class SqliteStore:
    """A SQLite file per node, in a folder of the node (``hostPath``) that outlives the pod."""


@dataclass(frozen=True)
class UrlStore:
    """A PostgreSQL URL (a Pulumi secret: it may hold a password), for a database run elsewhere,
    and the PEM of the CA its server's certificate is verified against (None: not verified)."""

    url: pulumi.Output[str]
    ca_certificate: str | None = None


@dataclass(frozen=True)
class PostgresStore:
    """A database the stack runs (CloudNativePG or RDS): TLS verified, password from a Secret."""

    endpoint: StoreEndpoint


ProfilerStore = SqliteStore | UrlStore | PostgresStore
