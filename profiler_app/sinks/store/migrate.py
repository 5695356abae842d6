"""Store migrations in a child process, so that the daemon never holds Alembic in its memory.

``gpu-profiler run`` checks the store's revision with one query; only when a migration is due
does it run ``python -m profiler_app.sinks.store.migrate``, which loads Alembic (about 12 MiB)
and the revision scripts, migrates and exits. The URL travels in the environment (not in the
command line, where other users could read a password); the child answers with its exit status
and one line on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from profiler_app.sinks.store.engine import (
    UnknownSchemaError,
    create_store_engine,
    describe_error,
    parse_store_url,
    schema_is_current,
    upgrade_to_head,
)

URL_VARIABLE = "GPU_PROFILER_MIGRATE_URL"
UNKNOWN_SCHEMA = 3
DATABASE_FAILED = 4
TIMEOUT_SECONDS = 600.0  # a large PostgreSQL table's migration; a hung one must not hang the daemon


class MigrationFailedError(Exception):
    """The migration did not happen (database unavailable, child failed); worth a retry."""


def migrate_in_child(engine: Engine, url: str) -> bool:
    """Migrates the store at ``url`` in a child process when it is behind; True if it ran.

    ``UnknownSchemaError`` for a newer version's schema; ``MigrationFailedError`` otherwise; the
    revision check's own ``SQLAlchemyError`` passes through.
    """
    if schema_is_current(engine):
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


def main() -> int:
    engine = create_store_engine(parse_store_url(os.environ[URL_VARIABLE]), create_file=True)
    try:
        upgrade_to_head(engine)
    except UnknownSchemaError as error:
        print(error, file=sys.stderr)
        return UNKNOWN_SCHEMA
    except SQLAlchemyError as error:
        print(describe_error(error), file=sys.stderr)
        return DATABASE_FAILED
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
