"""Store migrations, in a child process for the daemon, so that it never holds Alembic or
SQLAlchemy in its memory.

``gpu-profiler run`` checks the store's revision with one query through the DB-API driver; only
when a migration is due does it run ``python -m profiler_app.sinks.store.migrate``, which loads
SQLAlchemy, Alembic and the revision scripts, migrates and exits. The URL travels in the
environment (not in the command line, where other users could read a password); the child
answers with its exit status and one line on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys

from profiler_app.sinks.store.dbapi import Database, UnknownSchemaError
from profiler_app.sinks.store.urls import StoreUrl, parse_store_url

URL_VARIABLE = "GPU_PROFILER_MIGRATE_URL"
UNKNOWN_SCHEMA = 3
DATABASE_FAILED = 4
TIMEOUT_SECONDS = 600.0  # a large PostgreSQL table's migration; a hung one must not hang the daemon


class MigrationFailedError(Exception):
    """The migration did not happen (database unavailable, child failed); worth a retry."""


def migrate_in_child(database: Database, url: str) -> bool:
    """Migrates the store at ``url`` in a child process when it is behind; True if it ran.

    ``UnknownSchemaError`` for a newer version's schema; ``MigrationFailedError`` otherwise; the
    revision check's own driver error passes through.
    """
    if database.schema_is_current():
        return False
    try:
        completed = subprocess.run(
            [sys.executable, "-m", __name__],
            env={**os.environ, URL_VARIABLE: url},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise MigrationFailedError(f"the migration process failed: {error}") from None
    lines = completed.stderr.strip().splitlines()
    reason = lines[-1] if lines else f"exit status {completed.returncode}"
    if completed.returncode == UNKNOWN_SCHEMA:
        raise UnknownSchemaError(reason)
    if completed.returncode != 0:
        raise MigrationFailedError(reason)
    return True


def migrate_here(url: StoreUrl) -> bool:
    """Migrates the store in this process (SQLAlchemy and Alembic load here); True if it ran.

    ``UnknownSchemaError`` for a newer version's schema; ``MigrationFailedError`` when the
    database failed.
    """
    # Imported here: the daemon, which migrates in a child, never loads SQLAlchemy.
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415

    from profiler_app.sinks.store.engine import (  # noqa: PLC0415
        create_store_engine,
        describe_error,
        upgrade_to_head,
    )

    engine = create_store_engine(url, create_file=True)
    try:
        return upgrade_to_head(engine)
    except SQLAlchemyError as error:
        raise MigrationFailedError(describe_error(error)) from None
    finally:
        engine.dispose()


def main() -> int:
    try:
        migrate_here(parse_store_url(os.environ[URL_VARIABLE]))
    except UnknownSchemaError as error:
        print(error, file=sys.stderr)
        return UNKNOWN_SCHEMA
    except MigrationFailedError as error:
        print(error, file=sys.stderr)
        return DATABASE_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
