"""Store URLs, engines and schema migrations.

SQLite (a file, the default) or PostgreSQL through psycopg 3. SQLite runs in WAL mode with
``synchronous=FULL``: each cycle commits once every few tens of seconds, so an fsync per commit
costs nothing, and in exchange a committed cycle survives power loss as well as a killed process.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError

from profiler_app.errors import UserError
from profiler_app.paths import user_path

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (about 12 MiB resident) is imported only when a migration is due: a store already at
# SCHEMA_HEAD is recognised by one query on alembic_version.

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions (a test checks it against Alembic's own answer).
SCHEMA_HEAD = "0003"
VERSION_TABLE = "alembic_version"
# Any fixed number: serialises concurrent upgrades by daemons sharing one PostgreSQL database.
MIGRATION_LOCK_ID = 0x67707570726F66
_SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
_URL_HELP = "use sqlite:///PATH or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"


def default_store_url() -> str:
    """The SQLite file under this user's data directory (created when the store opens)."""
    path = Path(platformdirs.user_data_dir("gpu-profiler")) / "profiler.db"
    return f"sqlite:///{path}"


def redact(url: str) -> str:
    """``url`` with any password masked, for messages about URLs that did not parse."""
    return re.sub(r"(://[^/@:]*:)[^/]*@", r"\1***@", url)


def parse_store_url(url: str) -> URL:
    """The SQLAlchemy URL for a store URL, or ``UserError`` saying what is wrong (no password)."""
    try:
        parsed = make_url(url.strip())
    except ArgumentError:
        raise UserError(f"malformed store URL {redact(url)!r}: {_URL_HELP}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend in {"postgresql", "postgres"}:
        if driver not in {"", "psycopg"}:
            raise UserError(f"unsupported PostgreSQL driver {driver!r}: use postgresql://")
        if importlib.util.find_spec("psycopg") is None:
            raise UserError(
                "a PostgreSQL store needs psycopg: pip install 'gpu-cluster-profiler[postgres]'"
            )
        if not parsed.database:
            raise UserError(f"store URL {display_url(parsed)!r} names no database")
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if driver not in {"", "pysqlite"}:
            raise UserError(f"unsupported SQLite driver {driver!r}: use sqlite:///PATH")
        if not parsed.database or parsed.database == ":memory:":
            raise UserError("a SQLite store needs a file: sqlite:///PATH")
        return parsed.set(drivername="sqlite+pysqlite")
    raise UserError(f"unsupported store URL scheme {parsed.drivername!r}: {_URL_HELP}")


def display_url(url: URL) -> str:
    """``url`` safe for logs and messages: the password is masked."""
    return url.render_as_string(hide_password=True)


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL; None for other backends."""
    if url.get_backend_name() != "sqlite" or url.database is None:
        return None
    return user_path(url.database)


def create_store_engine(url: URL, *, create_file: bool) -> Engine:
    """An engine for ``url``. SQLite: the file must exist unless ``create_file``."""
    path = sqlite_path(url)
    if path is not None:
        if create_file:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise UserError(
                    f"cannot create the store directory {path.parent}: {error}"
                ) from None
        elif not path.is_file():
            raise UserError(
                f"no store at {path} (run 'gpu-profiler run' first, or pass --store-url)"
            )
        url = url.set(database=str(path))
        engine = create_engine(
            url, connect_args={"timeout": _SQLITE_BUSY_TIMEOUT_SECONDS}, pool_pre_ping=True
        )
        _configure_sqlite(engine, writer=create_file)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,  # a PostgreSQL restart between cycles costs no failed cycle
        pool_size=1,
        max_overflow=1,
        connect_args={"connect_timeout": 10, "application_name": "gpu-profiler"},
    )


def _configure_sqlite(engine: Engine, *, writer: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # sqlite3's legacy mode would not BEGIN before DDL or SELECT; SQLAlchemy's "begin"
        # event below emits BEGIN instead, so migrations and cycles are whole transactions.
        dbapi_connection.isolation_level = None
        if not writer:
            return  # readers take the file as the daemon left it
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")


class UnknownSchemaError(Exception):
    """The store has a schema revision this gpu-profiler does not know (a newer version's)."""


def alembic_config() -> Config:
    """Alembic configuration built in code, so migrations run from an installed wheel."""
    from alembic.config import Config  # noqa: PLC0415

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade_to_head(engine: Engine) -> bool:
    """Migrates the store to ``SCHEMA_HEAD`` in one transaction; False when it was there already.

    ``UnknownSchemaError`` when the store has a revision Alembic does not know.
    """
    if schema_is_current(engine):
        return False
    from alembic import command  # noqa: PLC0415
    from alembic.util import CommandError  # noqa: PLC0415

    config = alembic_config()
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        config.attributes["connection"] = connection
        try:
            command.upgrade(config, "head")
        except CommandError as error:
            raise UnknownSchemaError(str(error)) from None
    return True


def schema_is_current(engine: Engine) -> bool:
    """Whether the store is at ``SCHEMA_HEAD`` (one query, no Alembic)."""
    with engine.connect() as connection:
        return current_revisions(connection) == (SCHEMA_HEAD,)


def head_revisions() -> tuple[str, ...]:
    """The newest schema revision(s) this version of gpu-profiler knows."""
    return (SCHEMA_HEAD,)


def current_revisions(connection: Connection) -> tuple[str, ...]:
    """The store's schema revision(s), sorted; empty when it has no gpu-profiler schema."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return ()
    rows = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))  # noqa: S608
    return tuple(sorted(row[0] for row in rows))


def describe_error(error: SQLAlchemyError) -> str:
    """The driver's first message line: no SQL, no parameters, no password."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        detail = str(error.orig).strip().splitlines()
        kind = "database unavailable" if isinstance(error, OperationalError) else "database error"
        return f"{kind}: {detail[0] if detail else type(error.orig).__name__}"
    return type(error).__name__
