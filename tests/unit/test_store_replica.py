"""benchmarks/store_replica.py: a node copied by SQL holds exactly the rows the daemon's writer
writes for that node (same history, the node's names), in every table with a node column."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from benchmarks.bench_reports import slots_of, tokens, write, writer
from benchmarks.store_replica import copy_nodes, create_engine, node_tables

HOURS = 9 / 24  # long enough for pods to restart and gaps to open; 108 cycles per node
TEMPLATE, TARGET = 4, 108  # both split GPU 0 (MIG); other groups, so every token changes


def _written(url: str, node: int, seed: int) -> None:
    store = writer(url, raw_days=14)
    write(store, {node: slots_of(node, random.Random(seed))}, HOURS)
    store.close()


def _rows(url: str, node: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each node table's rows of ``node``, without the database's own row numbers, sorted."""
    engine = create_engine(url)
    rows = {}
    with engine.connect() as connection:
        for table in node_tables(engine):
            columns = [column for column in table.c if column.name != "id"]
            selected = connection.execute(sa.select(*columns).where(table.c.node == node)).all()
            rows[table.name] = sorted((tuple(row) for row in selected), key=repr)
    engine.dispose()
    return rows


def test_copy_equals_the_writers_rows(tmp_path: Path) -> None:
    copied, written = f"sqlite:///{tmp_path / 'copied.db'}", f"sqlite:///{tmp_path / 'written.db'}"
    _written(copied, TEMPLATE, seed=TEMPLATE)
    counts = copy_nodes(copied, [(tokens(TEMPLATE), tokens(TARGET))], log=lambda _: None)
    _written(written, TARGET, seed=TEMPLATE)  # the template's history under the target's names

    expected = _rows(written, f"node-{TARGET:04d}")
    actual = _rows(copied, f"node-{TARGET:04d}")
    assert set(actual) == set(expected)
    for table in (
        "gpu_window",
        "gpu_hour",
        "pod_hour",
        "pod_usage",
        "rightsize_hour",
        "activity_hour",
    ):
        assert expected[table], f"the writer wrote no {table} rows: the comparison proves little"
    for table, rows in expected.items():
        assert actual[table] == rows, table
        assert counts[table] == len(rows), table
    # The template is untouched, and it differs from the target only by the names.
    template = _rows(copied, f"node-{TEMPLATE:04d}")
    assert [len(rows) for rows in template.values()] == [len(rows) for rows in actual.values()]
    assert template["gpu_window"] != actual["gpu_window"]


def test_a_node_is_not_copied_onto_a_template(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(ValueError, match="onto a template"):
        copy_nodes(url, [(tokens(0), tokens(0))])
