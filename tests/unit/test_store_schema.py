"""The table store's schema on SQLite and on a real PostgreSQL (``integration``, see
tests/support): the migrations match the models and reach the head, run down and up again, keep
the values of older revisions, run in a child process for the daemon, and a store of a newer
schema is refused."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from profiler_app.core.errors import UserError
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import alembic_config, create_store_engine, head_revisions
from profiler_app.sinks.store.models import gpu_window, metadata, pod_usage
from profiler_app.sinks.store.partitions import is_partition
from profiler_app.sinks.store.schema import SCHEMA_HEAD
from profiler_app.sinks.store.sink import _PEAK_COLUMNS, _POD_KEY, _gpu_window_row, _pod_row
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.migrations import migrate
from tests.support.store_cycles import T0, cycle, engine_for, pod, profile

pytest_plugins = ["tests.support.postgres"]


def test_migration_matches_models_and_reaches_head(store: TableStore, store_url: str) -> None:
    engine = engine_for(store_url)
    sqlite = engine.dialect.name == "sqlite"

    def compared(item: object, _name: object, kind: str, _reflected: bool, _other: object) -> bool:
        # BRIN indexes are PostgreSQL's (models._bucket_ranges): SQLite has none to compare.
        return not (sqlite and kind == "index" and _is_brin(item))

    with engine.connect() as connection:
        # The partitions the writer makes (PostgreSQL) are not the models'.
        context = MigrationContext.configure(
            connection,
            opts={
                "include_name": lambda name, kind, _: not (kind == "table" and is_partition(name)),
                "include_object": compared,
            },
        )
        assert set(context.get_current_heads()) == set(head_revisions())
        diff = compare_metadata(context, metadata)
        indexes = sa.inspect(connection).get_indexes("gpu_window")
    engine.dispose()
    assert diff == []
    assert {tuple(index["column_names"]) for index in indexes} == {("at",), ("node", "gpu", "at")}
    TableStore(store_url).close()  # opening an up-to-date store again migrates nothing


def _is_brin(index: object) -> bool:
    return isinstance(index, sa.Index) and index.dialect_options["postgresql"]["using"] == "brin"


def test_schema_head_is_alembics_head() -> None:
    assert ScriptDirectory.from_config(alembic_config()).get_heads() == [SCHEMA_HEAD]


def test_the_daemons_store_never_loads_sqlalchemy_or_alembic(store_url: str) -> None:
    """The daemon's memory: it writes through the DB-API driver, and a store behind is migrated
    by a child process (new processes here)."""
    probe = (
        "import sys; from profiler_app.sinks.store import TableStore; "
        f"TableStore({store_url!r}, migrate_in_child=True).close(); print(sorted(m for m in "
        "sys.modules if m.partition('.')[0] in ('alembic', 'sqlalchemy')))"
    )
    for _ in ("a new store, migrated", "the store at head"):
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )
        assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "[]", "")
        engine = engine_for(store_url)
        with engine.connect() as connection:
            assert MigrationContext.configure(connection).get_current_heads() == (SCHEMA_HEAD,)
        engine.dispose()


def test_the_writers_columns_are_the_tables_columns() -> None:
    """The DB-API writer names its columns by the rows it builds; the tables are models.py's."""
    window = _gpu_window_row(cycle(T0, [profile("0")]), profile("0"), None)
    usage = _pod_row(pod(), T0)
    for row, table in ((window, gpu_window), (usage, pod_usage)):
        required = {column.name for column in table.columns if not column.nullable} - {"id"}
        assert required <= set(row) <= set(table.columns.keys())
    assert set(_PEAK_COLUMNS) | set(_POD_KEY) <= set(pod_usage.columns.keys())


def test_a_migration_in_a_child_process_reports_a_newer_schema(
    store: TableStore, store_url: str
) -> None:
    engine = engine_for(store_url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(UserError, match="has a schema this gpu-profiler does not know"):
        TableStore(store_url, migrate_in_child=True)


def test_migrations_downgrade_and_upgrade_again(store: TableStore, store_url: str) -> None:
    engine = engine_for(store_url)
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
    with engine.connect() as connection:
        assert set(sa.inspect(connection).get_table_names()) == {"alembic_version"}
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with engine.connect() as connection:
        assert {"gpu_window", "pod_usage"} <= set(sa.inspect(connection).get_table_names())
    engine.dispose()


def test_0017_ranges_the_buckets_of_every_partition_and_back(store_url: str) -> None:
    """On PostgreSQL revision 0017's BRIN indexes reach every partition of gpu_hour and gpu_day:
    those there when it runs and those the writer attaches after; down to 0016 they go. SQLite
    has none, either way."""
    store = TableStore(store_url)
    store.publish(cycle(T0, [profile("0")]))
    store.close()
    engine = engine_for(store_url)
    try:
        migrate(engine, "0016_idle_block_gpus", down=True)
        before = _bucket_ranges(engine)
        migrate(engine, "head")
        store = TableStore(store_url)
        store.publish(cycle(T0 + timedelta(days=62), [profile("0")]))  # a later month's partition
        store.close()
        after = _bucket_ranges(engine)
    finally:
        engine.dispose()
    if engine.dialect.name == "sqlite":
        assert before == after == {}
        return
    assert set(before.values()) == {False}
    assert {"gpu_hour_p202601", "gpu_day_p202601", "gpu_hour_p202603", "gpu_day_p202603"} <= set(
        after
    )
    assert set(after.values()) == {True}


def _bucket_ranges(engine: sa.Engine) -> dict[str, bool]:
    """Whether each partition of gpu_hour and gpu_day has a BRIN index on its bucket, summarised
    by autovacuum."""
    if engine.dialect.name != "postgresql":
        return {}
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT p.relname, EXISTS (SELECT FROM pg_index x"
                " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am a ON a.oid = i.relam"
                " JOIN pg_attribute c ON c.attrelid = p.oid AND c.attnum = x.indkey[0]"
                " WHERE x.indrelid = p.oid AND a.amname = 'brin' AND x.indnatts = 1"
                " AND i.reloptions = '{autosummarize=on}'"
                " AND c.attname IN ('hour', 'day'))"
                " FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhrelid"
                " WHERE h.inhparent IN ('gpu_hour'::regclass, 'gpu_day'::regclass)"
            )
        ).all()
    return {name: bool(has) for name, has in rows}


def test_migration_0003_keeps_memory_copy_values(store_url: str) -> None:
    """A store written before revision 0003 keeps its memory-copy values under the new names."""
    config = alembic_config()
    raw = create_store_engine(parse_store_url(store_url), create_file=True)
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
        connection.execute(
            sa.text(
                "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, window_seconds,"
                " covers_seconds, mem_util_max) VALUES (:at, 'n', '0', 'u', 'idle', 60, 60, 42)"
            ),
            {"at": T0.replace(tzinfo=None)},
        )
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with raw.connect() as connection:
        rows = connection.execute(sa.text("SELECT mem_copy_util_max, confidence FROM gpu_window"))
        assert [tuple(row) for row in rows] == [(42.0, None)]
    raw.dispose()


def test_the_engine_revision_adds_empty_columns_to_rows_written_before(store_url: str) -> None:
    """Rows written at revision 0003 keep everything and read NULL for engine and framework;
    downgrading drops the two columns again."""
    config = alembic_config()
    raw = create_store_engine(parse_store_url(store_url), create_file=True)
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003")
        connection.execute(
            sa.text(
                "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, window_seconds,"
                " covers_seconds, basis) VALUES (:at, 'n', '0', 'u', 'idle', 60, 60, 'idle')"
            ),
            {"at": T0.replace(tzinfo=None)},
        )
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    with raw.connect() as connection:
        rows = connection.execute(sa.text("SELECT basis, engine, framework FROM gpu_window"))
        assert [tuple(row) for row in rows] == [("idle", None, None)]
    with raw.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
    with raw.connect() as connection:
        columns = {column["name"] for column in sa.inspect(connection).get_columns("gpu_window")}
        assert "engine" not in columns
        assert "basis" in columns
    raw.dispose()


def test_a_store_from_a_newer_version_is_refused(store: TableStore, store_url: str) -> None:
    engine = engine_for(store_url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(UserError, match="has a schema this gpu-profiler does not know"):
        TableStore(store_url)
