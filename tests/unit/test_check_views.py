"""benchmarks/check_views.py: its SQL over the raw rows agrees with every report view on a store
written through the daemon's writer, and finds a raw row the rollups no longer match."""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks.bench_reports import END, slots_of, write, writer
from benchmarks.check_views import Differences, check
from benchmarks.store_replica import create_engine
from profiler_app.cli import main

SINCE = "4h"  # inside the 7 hours written: its start cuts through raw rows (an edge)


def _in_process(url: str) -> Callable[[str], list[Any]]:
    """``bench_reports.cli_report``'s rows, from ``gpu-profiler report`` run in this process."""

    def report(view: str) -> list[Any]:
        out = io.StringIO()
        arguments = ["report", "--store-url", url, "--by", view, "--since", SINCE]
        arguments += ["--until", END.isoformat(), "--top", "0", "-o", "json"]
        with contextlib.redirect_stdout(out):
            assert main(arguments) == 0
        rows: list[Any] = json.loads(out.getvalue())["rows"]
        return rows

    return report


def _checked(url: str) -> Differences:
    engine = create_engine(url)
    with engine.connect() as connection:
        differences = check(connection, _in_process(url), END - timedelta(hours=4), END, sample=2)
    engine.dispose()
    return differences


def test_the_checker_agrees_with_the_report_and_finds_a_changed_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = writer(url, raw_days=14)
    write(store, {node: slots_of(node, random.Random(node)) for node in (0, 1)}, 7 / 24)
    store.close()

    differences = _checked(url)
    for view in ("gpu", "node", "waste", "pod"):
        assert any(name.startswith(f"{view} ") for name in differences.compared), view
    assert differences.largest, "nothing compared"
    assert max(differences.largest.values()) < 1e-6, differences.largest

    # A raw row whose idle fraction no longer matches the rollups the report reads.
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE gpu_window SET util_idle_fraction = 1 - coalesce(util_idle_fraction, 0)"
                " WHERE at <= :middle AND at >= :early"
            ),
            {
                "middle": f"{END - timedelta(hours=2):%Y-%m-%d %H:%M:%S}",
                "early": f"{END - timedelta(hours=3):%Y-%m-%d %H:%M:%S}",
            },
        )
    engine.dispose()
    assert _checked(url).largest["gpu idle_gpu_hours"] > 0.1
