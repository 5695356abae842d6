"""The daemon's connection to the store: the DB-API drivers (sqlite3, psycopg), no SQLAlchemy.

SQLAlchemy Core cost the long-running daemon about 11 MiB for a few statements per cycle; it
stays for migrations (Alembic, in a child process), ``report`` and ``trace``. The tables are
defined once, in ``models.py``: the writers build their statements from column names, and the
store tests run them against the migrated schema on SQLite and PostgreSQL.

SQLite (a file, the default) runs in WAL mode with ``synchronous=FULL``: each cycle commits once
every few tens of seconds, so an fsync per commit costs nothing, and in exchange a committed
cycle survives power loss as well as a killed process. Both drivers run in autocommit mode, and
``transaction()`` issues BEGIN and COMMIT itself, so each cycle is one transaction.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiler_app.core.errors import UserError
from profiler_app.sinks.store.schema import SCHEMA_HEAD, VERSION_TABLE
from profiler_app.sinks.store.urls import StoreUrl, default_store_url, parse_store_url

# Whether VERSION_TABLE exists, in the search path on PostgreSQL (report shares these).
HAS_VERSION_TABLE = {
    "sqlite": "SELECT count(1) FROM sqlite_master WHERE name = 'alembic_version' AND type='table'",
    "postgresql": "SELECT to_regclass('alembic_version') IS NOT NULL",
}
READ_REVISIONS = f"SELECT version_num FROM {VERSION_TABLE}"  # noqa: S608 (a constant)
# SQLAlchemy's text form of a SQLite DateTime: naive UTC, always with microseconds, so that
# rows written here and by SQLAlchemy compare and sort as text.
SQLITE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
POSTGRESQL_DEFAULTS = {"connect_timeout": 10, "application_name": "gpu-profiler"}


class UnknownSchemaError(Exception):
    """The store has a schema revision this gpu-profiler does not know (a newer version's)."""


def driver_errors(backend: str) -> tuple[type[Exception], ...]:
    """The exceptions a backend's driver raises (PEP 249 ``Error``)."""
    if backend == "postgresql":
        import psycopg  # noqa: PLC0415

        return (psycopg.Error,)
    return (sqlite3.Error,)


def describe_driver_error(error: BaseException) -> str:
    """The driver's first message line: no SQL, no parameters, no password."""
    detail = str(error).strip().splitlines()
    # SQLITE_FULL (13): "database or disk is full", which says neither which nor what to do.
    if getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return "disk full: no space left for the SQLite store (free space on its volume)"
    # PEP 249's OperationalError (both drivers): the database is down, locked or unreachable.
    operational = any(base.__name__ == "OperationalError" for base in type(error).__mro__)
    kind = "database unavailable" if operational else "database error"
    return f"{kind}: {detail[0] if detail else type(error).__name__}"


def sqlite_file(url: StoreUrl, *, create: bool) -> Path | None:
    """The SQLite file of ``url``, None for PostgreSQL. ``create``: its folder is made if
    the one above exists (the whole path of our own data folder, where the default store and
    the demo's live; the file comes with the first connection); otherwise the file must exist."""
    path = url.sqlite_path()
    if path is None:
        return None
    if create:
        if path.parent.is_dir():
            return path
        # Our data folder's parents are ours to make (a fresh account may have no
        # ~/.local/share); for a path the user gave, the file's own folder at most (as mkdir
        # without -p), so a typo cannot grow a tree from the root.
        default_file = parse_store_url(default_store_url()).sqlite_path()
        default = default_file is not None and path.parent == default_file.parent
        if not default and not path.parent.parent.is_dir():
            raise UserError(
                f"cannot create the store {path}: the folder {path.parent.parent} does not exist"
            )
        try:
            path.parent.mkdir(parents=default, exist_ok=True)
        except OSError as error:
            raise UserError(f"cannot create the store directory {path.parent}: {error}") from None
    elif not path.is_file():
        raise UserError(f"no store at {path} (run 'gpu-profiler run' first, or pass --store-url)")
    return path


def prepare_sqlite_writer(connection: sqlite3.Connection) -> None:
    """WAL and a full sync per commit, on a connection that will write (engine.py's too)."""
    cursor = connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
    finally:
        cursor.close()


class Database:
    """One connection to the store, opened on first use and again after a failure."""

    def __init__(self, url: StoreUrl) -> None:
        self.url = url
        self.backend = url.backend
        self.errors = driver_errors(self.backend)
        self._connection: Any = None
        sqlite_file(url, create=True)

    def param(self, name: str) -> str:
        """The driver's placeholder for the named parameter ``name``."""
        return f":{name}" if self.backend == "sqlite" else f"%({name})s"

    def bind(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``row`` with its datetimes as the column type wants them (aware UTC only)."""
        return {
            key: self._bind_time(value) if isinstance(value, datetime) else value
            for key, value in row.items()
        }

    def _bind_time(self, value: datetime) -> Any:
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} given to the store; use UTC")
        value = value.astimezone(UTC)
        return value.strftime(SQLITE_TIME_FORMAT) if self.backend == "sqlite" else value

    @staticmethod
    def read_time(value: Any) -> datetime:
        """A stored time as an aware UTC datetime (SQLite gives text, PostgreSQL timestamptz)."""
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor inside BEGIN ... COMMIT; rolled back on any error. A driver error closes
        the connection, so the next transaction starts on a fresh one."""
        cursor = self._begin()
        try:
            yield cursor
            cursor.execute("COMMIT")
        except BaseException as error:
            self._rollback(cursor, error)
            raise
        finally:
            # After a failed rollback the connection is closed, and closing its cursor would
            # raise "Cannot operate on a closed database", hiding the error that mattered.
            with contextlib.suppress(*self.errors):
                cursor.close()

    def query(self, statement: str, parameters: Mapping[str, Any] | None = None) -> list[Any]:
        """The rows of one read outside a transaction."""
        try:
            cursor = self._connect().cursor()
            try:
                if parameters is None:
                    cursor.execute(statement)
                else:
                    cursor.execute(statement, parameters)
                return list(cursor.fetchall())
            finally:
                cursor.close()
        except self.errors:
            self.close()
            raise

    def revisions(self) -> tuple[str, ...]:
        """The store's schema revision(s), sorted; empty when it has no gpu-profiler schema."""
        if not self.query(HAS_VERSION_TABLE[self.backend])[0][0]:
            return ()
        return tuple(sorted(row[0] for row in self.query(READ_REVISIONS)))

    def schema_is_current(self) -> bool:
        """Whether the store is at ``SCHEMA_HEAD`` (one or two queries, no Alembic)."""
        return self.revisions() == (SCHEMA_HEAD,)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(*self.errors):  # a broken connection is gone either way
                connection.close()

    def _begin(self) -> Any:
        reused = self._connection is not None
        try:
            return self._begin_on_connection()
        except self.errors:
            if not reused:
                raise
        # The kept connection died between cycles (e.g. PostgreSQL restarted): one fresh try.
        return self._begin_on_connection()

    def _begin_on_connection(self) -> Any:
        try:
            cursor = self._connect().cursor()
            cursor.execute("BEGIN")
        except self.errors:
            self.close()
            raise
        return cursor

    def _rollback(self, cursor: Any, error: BaseException) -> None:
        try:
            cursor.execute("ROLLBACK")
        except self.errors:
            self.close()
            return
        if isinstance(error, self.errors):
            self.close()

    def _connect(self) -> Any:
        if self._connection is None:
            self._connection = self._open()
        return self._connection

    def _open(self) -> Any:
        path = self.url.sqlite_path()
        if path is not None:
            # check_same_thread off: the store opens in the main thread and writes in the
            # cycle's worker, one cycle at a time.
            connection = sqlite3.connect(
                path,
                timeout=SQLITE_BUSY_TIMEOUT_SECONDS,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                prepare_sqlite_writer(connection)
            except sqlite3.Error:
                connection.close()
                raise
            return connection
        import psycopg  # noqa: PLC0415

        options: dict[str, Any] = {
            "host": self.url.host,
            "port": self.url.port,
            "user": self.url.username,
            "password": self.url.password,
            "dbname": self.url.database,
            **POSTGRESQL_DEFAULTS,
        }
        options.update(self.url.query)  # libpq options in the URL win
        return psycopg.connect(
            autocommit=True,
            # No server-side prepared statements: through PgBouncer in transaction mode the next
            # transaction may run on another server connection, which never prepared them.
            prepare_threshold=None,
            **{key: value for key, value in options.items() if value is not None},
        )
