"""SQLAlchemy engines and Alembic migrations: for the migration process, ``report`` and
``trace``. The daemon writes through the DB-API drivers instead (``dbapi.py``).

SQLite (a file) or PostgreSQL through psycopg 3, from the parts ``urls.parse_store_url`` found.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from profiler_app.sinks.store.dbapi import (
    HAS_VERSION_TABLE,
    POSTGRESQL_DEFAULTS,
    READ_REVISIONS,
    SQLITE_BUSY_TIMEOUT_SECONDS,
    UnknownSchemaError,
    describe_driver_error,
    prepare_sqlite_writer,
    sqlite_file,
)
from profiler_app.sinks.store.schema import SCHEMA_HEAD
from profiler_app.sinks.store.urls import StoreUrl

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (about 12 MiB resident) is imported only when a migration is due: a store already at
# SCHEMA_HEAD is recognised by one query on alembic_version.

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any fixed number: serialises concurrent upgrades by daemons sharing one PostgreSQL database.
MIGRATION_LOCK_ID = 0x67707570726F66


def sqlalchemy_url(url: StoreUrl) -> URL:
    """SQLAlchemy's URL for the same parts (the SQLite path with ``~`` expanded)."""
    path = url.sqlite_path()
    if path is not None:
        return URL.create("sqlite+pysqlite", database=str(path))
    return URL.create(
        "postgresql+psycopg",
        username=url.username,
        password=url.password,
        host=url.host,
        port=url.port,
        database=url.database,
        query=url.query,
    )


def create_store_engine(url: StoreUrl, *, create_file: bool) -> Engine:
    """An engine for ``url``. SQLite: the file must exist unless ``create_file``."""
    if sqlite_file(url, create=create_file) is not None:
        engine = create_engine(
            sqlalchemy_url(url),
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            pool_pre_ping=True,
        )
        _configure_sqlite(engine, writer=create_file)
        return engine
    return create_engine(
        sqlalchemy_url(url),
        pool_pre_ping=True,  # a PostgreSQL restart between uses costs no failed query
        pool_size=1,
        max_overflow=1,
        # Defaults; libpq options in the URL win, as in the daemon's dbapi.Database. No
        # server-side prepared statements, which PgBouncer's transaction mode cannot route.
        connect_args={
            **{key: value for key, value in POSTGRESQL_DEFAULTS.items() if key not in url.query},
            "prepare_threshold": None,
        },
    )


def _configure_sqlite(engine: Engine, *, writer: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # sqlite3's legacy mode would not BEGIN before DDL or SELECT; SQLAlchemy's "begin"
        # event below emits BEGIN instead, so migrations and cycles are whole transactions.
        dbapi_connection.isolation_level = None
        if writer:  # readers take the file as the daemon left it
            prepare_sqlite_writer(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")


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
    """The store's schema revision(s), sorted; empty when it has no gpu-profiler schema.

    The same statements as the daemon's ``Database.revisions``."""
    if not connection.exec_driver_sql(HAS_VERSION_TABLE[connection.dialect.name]).scalar():
        return ()
    return tuple(sorted(row[0] for row in connection.exec_driver_sql(READ_REVISIONS)))


def describe_error(error: SQLAlchemyError) -> str:
    """The driver's first message line: no SQL, no parameters, no password."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        return describe_driver_error(error.orig)
    return type(error).__name__
