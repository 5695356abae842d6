"""benchmarks/store_replica.py: a node copied by SQL holds exactly the rows the daemon's writer
writes for that node (same history, the node's names), in every table with a node column, and
its group's workloads the rows the writer writes for them in the tables keyed by workload."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from benchmarks.bench_reports import group_token, slots_of, tokens, write, writer
from benchmarks.store_replica import copy_nodes, create_engine, node_tables, workload_tables

HOURS = 9 / 24  # long enough for pods to restart and gaps to open; 108 cycles per node
TEMPLATE, TARGET = 4, 108  # both split GPU 0 (MIG); other groups, so every token changes


def _written(url: str, node: int, seed: int) -> None:
    store = writer(url, raw_days=14)
    write(store, {node: slots_of(node, random.Random(seed))}, HOURS)
    store.close()


def _rows(url: str, node: int) -> dict[str, list[tuple[Any, ...]]]:
    """Each node table's rows of ``node`` and each workload table's rows of its group, without
    the database's own row numbers, sorted."""
    engine = create_engine(url)
    rows = {}
    with engine.connect() as connection:
        for table in [*node_tables(engine), *workload_tables(engine)]:
            columns = [column for column in table.c if column.name != "id"]
            mine = (
                table.c.node == f"node-{node:04d}"
                if "node" in table.c
                else table.c.workload.contains(group_token(node))
            )
            selected = connection.execute(sa.select(*columns).where(mine)).all()
            rows[table.name] = sorted((tuple(row) for row in selected), key=repr)
    engine.dispose()
    return rows


def test_copy_equals_the_writers_rows(tmp_path: Path) -> None:
    copied, written = f"sqlite:///{tmp_path / 'copied.db'}", f"sqlite:///{tmp_path / 'written.db'}"
    _written(copied, TEMPLATE, seed=TEMPLATE)
    counts = copy_nodes(copied, [(tokens(TEMPLATE), tokens(TARGET))], log=lambda _: None)
    _written(written, TARGET, seed=TEMPLATE)  # the template's history under the target's names

    expected = _rows(written, TARGET)
    actual = _rows(copied, TARGET)
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
    template = _rows(copied, TEMPLATE)
    assert [len(rows) for rows in template.values()] == [len(rows) for rows in actual.values()]
    assert template["gpu_window"] != actual["gpu_window"]


def test_a_node_is_not_copied_onto_a_template(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(ValueError, match="onto a template"):
        copy_nodes(url, [(tokens(0), tokens(0))])


def test_a_group_is_copied_whole_or_not_at_all(tmp_path: Path) -> None:
    """Two copies of one template in one target group would double its workloads' merged rows."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(ValueError, match="each template of one template group once"):
        copy_nodes(url, [(tokens(0), tokens(100)), (tokens(0), tokens(101))])
