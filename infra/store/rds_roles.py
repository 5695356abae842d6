"""Create or update the profiler's database and roles on Amazon RDS, as its master user.

Runs in the RDS store's bootstrap Job (the profiler's image: Python and psycopg, nothing of this
repository), so it imports nothing but the standard library and psycopg. Idempotent: every run
leaves the same state, and sets the passwords it is given.

- the writer: owns the database (the daemons' migrations create and alter its tables);
- the reader: ``pg_read_all_data`` (every table, those created later too) and nothing else.

Passwords are sent as SCRAM-SHA-256 verifiers computed here (libpq's PQencryptPasswordConn), so
the plain text is in no statement the server could log. The master user's credentials come from
Secrets Manager, as a JSON file the Job's first container writes to a memory-backed volume.

Environment: ``PGHOST``, ``PGPORT``, ``PGSSLROOTCERT`` (the CA bundle), ``MASTER_SECRET_FILE``,
``STORE_DATABASE``, ``READER_CONNECTION_LIMIT``, and ``WRITER_SECRET_DIR``, ``READER_SECRET_DIR``:
the users' mounted basic-auth Secrets (files ``username`` and ``password``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql


def _encrypted(connection: psycopg.Connection[Any], user: str, password: str) -> str:
    verifier = connection.pgconn.encrypt_password(
        password.encode(), user.encode(), b"scram-sha-256"
    )
    return verifier.decode()


def _role_exists(connection: psycopg.Connection[Any], role: str) -> bool:
    row = connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    return row is not None


def _ensure_login(
    connection: psycopg.Connection[Any], role: str, password: str, limit: int = -1
) -> None:
    verb = "ALTER" if _role_exists(connection, role) else "CREATE"
    connection.execute(
        sql.SQL(verb + " ROLE {} WITH LOGIN PASSWORD {} CONNECTION LIMIT {}").format(
            sql.Identifier(role),
            sql.Literal(_encrypted(connection, role, password)),
            sql.Literal(limit),
        )
    )


def ensure_roles(
    connection: psycopg.Connection[Any],
    database: str,
    writer: tuple[str, str],
    reader: tuple[str, str],
    reader_connection_limit: int,
) -> None:
    """The database owned by the writer, the reader in pg_read_all_data; on an autocommit
    connection to another database (``postgres``) as a role with CREATEROLE and CREATEDB."""
    (writer_name, writer_password), (reader_name, reader_password) = writer, reader
    _ensure_login(connection, writer_name, writer_password)
    _ensure_login(connection, reader_name, reader_password, reader_connection_limit)
    # Making the writer a database's owner needs membership in it (PostgreSQL 16 and later do not
    # grant it to the role's creator by themselves).
    connection.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(sql.Identifier(writer_name)))
    connection.execute(sql.SQL("GRANT pg_read_all_data TO {}").format(sql.Identifier(reader_name)))
    exists = connection.execute(
        "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
    ).fetchone()
    statement = "ALTER DATABASE {} OWNER TO {}" if exists else "CREATE DATABASE {} OWNER {}"
    connection.execute(
        sql.SQL(statement).format(sql.Identifier(database), sql.Identifier(writer_name))
    )


def _credentials(folder: str) -> tuple[str, str]:
    """``(username, password)`` of a mounted basic-auth Secret."""
    return (
        (Path(folder) / "username").read_text().strip(),
        (Path(folder) / "password").read_text().strip(),
    )


def main() -> int:
    env = os.environ
    try:
        master = json.loads(Path(env["MASTER_SECRET_FILE"]).read_text())
        writer = _credentials(env["WRITER_SECRET_DIR"])
        reader = _credentials(env["READER_SECRET_DIR"])
        with psycopg.connect(
            dbname="postgres",
            user=master["username"],
            password=master["password"],
            sslmode="verify-full",
            connect_timeout=15,
            autocommit=True,
        ) as connection:
            ensure_roles(
                connection,
                env["STORE_DATABASE"],
                writer,
                reader,
                int(env["READER_CONNECTION_LIMIT"]),
            )
    except (KeyError, ValueError, OSError, psycopg.Error) as error:
        # The error's first line: no statement (they hold verifiers), no password.
        detail = str(error).strip().splitlines()
        print(
            f"rds-roles: error: {type(error).__name__}: {detail[0] if detail else ''}",
            file=sys.stderr,
        )
        return 1
    print(f"rds-roles: database {env['STORE_DATABASE']} and its roles are in place")
    return 0


if __name__ == "__main__":
    sys.exit(main())
