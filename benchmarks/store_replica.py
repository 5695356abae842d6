"""Copy nodes' rows to other nodes inside a store, by SQL, for fleet-scale benchmarks.

Writing thousands of nodes x 30 days through ``TableStore.publish`` takes days on a small
machine; a few template nodes written that way and copied many times take minutes. The copy is
generic: every table the store holds (found by reflection, so tables added by later revisions
are copied too) that has a ``node`` column gets, per target node, its template's rows with every
name token replaced (``bench_reports.tokens``: the node's name, its GPUs' UUID prefix, its pods'
and its workloads' tokens), in time order across all targets, one slice of time per
transaction, as daemons append. Tables keyed by workload without a node (right-sizing's
rollups) merge the nodes a workload ran on, so they are copied per group of nodes (the last
token): a target group must receive a copy of every template of its template group, once.
Nothing is packed afterwards: only ``ANALYZE`` (what autovacuum does after many inserts) runs
at the end. ``tests/unit/test_store_replica.py`` proves a copy equal to what the writer writes
for the renamed node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from profiler_app.sinks.store.engine import sqlalchemy_url
from profiler_app.sinks.store.partitions import is_partition
from profiler_app.sinks.store.urls import parse_store_url

MAP_TABLE = "bench_replica_map"
SLICE_ROWS = 3_000_000  # rows written per transaction, about


def create_engine(url: str) -> sa.Engine:
    return sa.create_engine(sqlalchemy_url(parse_store_url(url)))


def node_tables(engine: sa.Engine) -> list[sa.Table]:
    """Every table with a ``node`` column, partitions' parents only (PostgreSQL's partitions
    are tables of their own to reflection)."""
    inspector = sa.inspect(engine)
    names = set(inspector.get_table_names())
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            names -= set(
                connection.execute(
                    sa.text(
                        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    )
                ).scalars()
            )
    metadata = sa.MetaData()
    metadata.reflect(engine, only=sorted(names - {MAP_TABLE}))
    return [table for table in metadata.sorted_tables if "node" in table.c]


def workload_tables(engine: sa.Engine) -> list[sa.Table]:
    """Every table keyed by workload without a node (rows merged over a workload's nodes)."""
    metadata = sa.MetaData()
    tables = [table.name for table in node_tables(engine)]
    names = set(sa.inspect(engine).get_table_names()) - set(tables) - {MAP_TABLE}
    metadata.reflect(engine, only=sorted(names))
    return [
        table
        for table in metadata.sorted_tables
        if "workload" in table.c and "node" not in table.c and not is_partition(table.name)
    ]


def _check_whole_groups(copies: Sequence[tuple[Sequence[str], Sequence[str]]]) -> None:
    """A workload's rows hold every node of its group: a target group must get each template of
    one template group exactly once, else its merged rows would not be a copy's."""
    templates_of_group: dict[str, set[str]] = {}
    received: dict[str, list[tuple[str, str]]] = {}
    for template, target in copies:
        templates_of_group.setdefault(template[-1], set()).add(template[0])
        received.setdefault(target[-1], []).append((template[-1], template[0]))
    for group, copied in received.items():
        sources = {source for source, _ in copied}
        nodes = [node for _, node in copied]
        if len(sources) != 1 or sorted(nodes) != sorted(templates_of_group[sources.pop()]):
            raise ValueError(
                f"group {group!r} must receive each template of one template group once "
                "(workload rollups merge a group's nodes)"
            )


def _generated(table: sa.Table, column: sa.Column[Any]) -> bool:
    """A key the database numbers itself (gpu_window's id): left to the database."""
    if not column.primary_key or not isinstance(column.type, sa.Integer):
        return False
    default = column.server_default
    if default is not None and "nextval" in str(getattr(default, "arg", "")):
        return True
    return len(table.primary_key.columns) == 1  # SQLite's INTEGER PRIMARY KEY (the rowid)


def _time_column(table: sa.Table) -> sa.Column[Any]:
    """The column rows are appended in the order of: the first time in the key, else any."""
    for columns in (list(table.primary_key.columns), list(table.c)):
        for column in columns:
            if isinstance(column.type, sa.DateTime | sa.TIMESTAMP):
                return column
    raise ValueError(f"{table.name}: no time column to copy in order of")


def copy_nodes(
    url: str,
    copies: Sequence[tuple[Sequence[str], Sequence[str]]],
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Copy each template's rows to its target: ``copies`` holds (template tokens, target
    tokens) pairs, the node name first; a target must not exist yet. Returns rows per table."""
    if not copies:
        return {}
    width = len(copies[0][0])
    templates = {template[0] for template, _ in copies}
    if templates & {target[0] for _, target in copies}:
        raise ValueError("a node cannot be copied onto a template")
    _check_whole_groups(copies)
    engine = create_engine(url)
    tables = node_tables(engine)
    merged = workload_tables(engine)
    quote = engine.dialect.identifier_preparer.quote
    written: dict[str, int] = {}
    with engine.connect() as connection:
        connection.execute(sa.text(f"DROP TABLE IF EXISTS {MAP_TABLE}"))
        olds = ", ".join(f"o{i} VARCHAR(253), n{i} VARCHAR(253)" for i in range(width))
        connection.execute(sa.text(f"CREATE TABLE {MAP_TABLE} (template VARCHAR(253), {olds})"))
        connection.execute(
            sa.text(
                f"INSERT INTO {MAP_TABLE} VALUES (:t, "
                + ", ".join(f":o{i}, :n{i}" for i in range(width))
                + ")"
            ),
            [
                {"t": template[0]}
                | {f"o{i}": template[i] for i in range(width)}
                | {f"n{i}": target[i] for i in range(width)}
                for template, target in copies
            ],
        )
        connection.commit()
        copier = _Copier(connection, quote, width, sorted(templates), copies)
        for table in [*tables, *merged]:
            began = time.monotonic()
            written[table.name] = copier.copy(table, by_group=table in merged)
            log(f"  {table.name}: {written[table.name]:,} rows, {time.monotonic() - began:.0f} s")
        connection.execute(sa.text(f"DROP TABLE {MAP_TABLE}"))
        connection.commit()
        for table in [*tables, *merged]:  # what autovacuum's analyze would do after inserts
            connection.execute(sa.text(f"ANALYZE {quote(table.name)}"))
        connection.commit()
    engine.dispose()
    return written


class _Copier:
    """Copies one table's template rows to every target, a slice of time per transaction."""

    def __init__(
        self,
        connection: sa.Connection,
        quote: Callable[[str], str],
        width: int,
        templates: list[str],
        copies: Sequence[tuple[Sequence[str], Sequence[str]]],
    ) -> None:
        self.connection, self.quote, self.width = connection, quote, width
        self.per_template = len(copies) / len(templates)
        marks = ", ".join(f":t{i}" for i in range(len(templates)))
        self.bind = {f"t{i}": template for i, template in enumerate(templates)}
        self.tokens = sorted({token for template, _ in copies for token in template})
        groups = sorted({template[-1] for template, _ in copies})
        self.per_group = len({target[-1] for _, target in copies}) / len(groups)
        self.bind |= {f"g{i}": f"%{group}%" for i, group in enumerate(groups)}
        self.of_node = f"t.{quote('node')} IN ({marks})"
        column = f"t.{quote('workload')}"
        self.of_group = " OR ".join(f"{column} LIKE :g{i}" for i in range(len(groups)))
        # One row per (template group, target group): a workload row is copied once per group.
        last = width - 1
        self.group_map = f"(SELECT DISTINCT o{last}, n{last} FROM {MAP_TABLE})"
        self.group_join = f"{column} LIKE '%' || m.o{last} || '%'"

    def copy(self, table: sa.Table, by_group: bool = False) -> int:
        name, quote = self.quote(table.name), self.quote
        is_template = f"({self.of_group})" if by_group else self.of_node
        width = 1 if by_group else self.width
        offset = self.width - 1 if by_group else 0
        expressions, names = [], []
        for column in table.c:
            if _generated(table, column):
                continue
            names.append(quote(column.name))
            value = f"t.{quote(column.name)}"
            if isinstance(column.type, sa.String) and self._holds_tokens(name, value, is_template):
                for i in range(offset, offset + width):
                    value = f"replace({value}, m.o{i}, m.n{i})"
            expressions.append(value)
        at = f"t.{quote(_time_column(table).name)}"
        counts = self.connection.execute(
            sa.text(
                f"SELECT {at}, count(*) FROM {name} t WHERE {is_template}"
                f" GROUP BY {at} ORDER BY {at}"
            ),
            self.bind,
        ).all()
        source = (
            f"{self.group_map} m ON {self.group_join}"
            if by_group
            else f"{MAP_TABLE} m ON t.{quote('node')} = m.template"
        )
        insert = sa.text(
            f"INSERT INTO {name} ({', '.join(names)}) SELECT {', '.join(expressions)}"
            f" FROM {name} t JOIN {source}"
            f" WHERE ({is_template}) AND {at} >= :first AND {at} <= :last ORDER BY {at}"
        )
        total, first, rows = 0, 0, 0.0
        copies = self.per_group if by_group else self.per_template
        for index, (_, count) in enumerate(counts):
            rows += count * copies
            if rows >= SLICE_ROWS or index == len(counts) - 1:
                bounds = {"first": counts[first][0], "last": counts[index][0]}
                total += self.connection.execute(insert, bounds | self.bind).rowcount
                self.connection.commit()
                first, rows = index + 1, 0.0
        return total

    def _holds_tokens(self, table: str, column: str, is_template: str) -> bool:
        """Whether any template row's value of ``column`` holds a token (only those are
        rewritten: replace() on every text column of every row would cost more)."""
        likes = " OR ".join(f"{column} LIKE :k{i}" for i in range(len(self.tokens)))
        found = self.connection.execute(
            sa.text(f"SELECT 1 FROM {table} t WHERE {is_template} AND ({likes}) LIMIT 1"),
            self.bind | {f"k{i}": f"%{token}%" for i, token in enumerate(self.tokens)},
        ).first()
        return found is not None


def describe(url: str) -> None:
    """Rows per table, workloads per GPU-day, and the database's size."""
    engine = create_engine(url)
    with engine.connect() as connection:
        for table in [*node_tables(engine), *workload_tables(engine)]:
            count = connection.execute(sa.select(sa.func.count()).select_from(table)).scalar()
            print(f"  {table.name:<16} {count:>14,} rows")
        # Distinct workloads per GPU (or MIG instance) and day, from the raw rows' day rollup.
        slots, pairs = connection.execute(
            sa.text(
                "SELECT count(DISTINCT day || node || gpu || gpu_i_id),"
                " count(DISTINCT day || node || gpu || gpu_i_id || namespace || owner_name)"
                " FROM gpu_day WHERE owner_name <> ''"
            )
        ).one()
        gpus = connection.execute(
            sa.text("SELECT count(DISTINCT node || '/' || gpu || '/' || gpu_i_id) FROM gpu_day")
        ).scalar()
        print(
            f"  {gpus:,} GPUs and MIG instances; {pairs / max(slots, 1):.2f} workloads per GPU-day"
        )
        if engine.dialect.name == "postgresql":
            size = connection.execute(
                sa.text("SELECT pg_size_pretty(pg_database_size(current_database()))")
            ).scalar()
            print(f"  database size {size}")
    engine.dispose()
