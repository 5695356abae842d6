"""Nothing is lost on rollouts: ``gpu-profiler run`` is replaced mid-run (SIGTERM, a new process
started, as a DaemonSet's rolling update does) against the same PostgreSQL store, reached through
PgBouncer in transaction mode; the covered time of every GPU runs on without a hole or an overlap.

Real parts: a Prometheus with dcgm-exporter data running on past the test, as a live exporter's
would, PostgreSQL and PgBouncer (tests/support); the daemons are subprocesses.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import psycopg
import pytest

from profiler_app.cli import main
from tests.e2e.conftest import DaemonProcess
from tests.support.dcgm import Dataset, standard_dataset
from tests.support.prometheus import PrometheusServer

if TYPE_CHECKING:
    from tests.support.pgbouncer import PgBouncer
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres", "tests.support.pgbouncer"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "gpu-node-1"
WINDOW_SECONDS = 60.0


@pytest.fixture(scope="module")
def live_prometheus() -> Iterator[tuple[PrometheusServer, Dataset]]:
    # From an hour ago (a node older than the window) to half an hour ahead.
    dataset = standard_dataset(nodes=1, gpus_per_node=4, hours=1.5, end=time.time() + 1800)
    with PrometheusServer(dataset.openmetrics) as server:
        yield server, dataset


def rows(url: str) -> list[tuple[str, str, datetime, float]]:
    with psycopg.connect(url) as connection:
        return list(
            connection.execute(
                "SELECT gpu, uuid, at, covers_seconds FROM gpu_window ORDER BY gpu, uuid, at"
            )
        )


def written_cycles(url: str) -> int:
    with psycopg.connect(url) as connection:
        if connection.execute("SELECT to_regclass('gpu_window')").fetchone() == (None,):
            return 0  # not migrated yet
        row = connection.execute("SELECT count(DISTINCT at) FROM gpu_window").fetchone()
        return int(row[0]) if row else 0


def test_a_replaced_daemon_leaves_no_hole_in_the_covered_hours(
    daemons: Callable[..., DaemonProcess],
    live_prometheus: tuple[PrometheusServer, Dataset],
    pgbouncer: PgBouncer,
    postgres_server: PostgresServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prometheus, dataset = live_prometheus
    direct = postgres_server.create_database()
    pooled = pgbouncer.url(direct.rsplit("/", 1)[1])
    args = [
        *("--prometheus-url", prometheus.url, "--node", NODE, "--store-url", pooled),
        *("--window", "1m", "--interval", "0.5s", "--store-interval", "2s"),
    ]
    first = daemons(*args)
    first.wait_for(lambda: written_cycles(direct) >= 3, 90, "three written cycles")
    status, _ = first.terminate()  # the rollout: the old pod goes ...
    assert status == 0
    before = written_cycles(direct)
    second = daemons(*args)  # ... and the new one starts
    second.wait_for(lambda: written_cycles(direct) >= before + 3, 90, "three more cycles")
    status, _ = second.terminate()
    assert status == 0

    stored = rows(direct)
    gpus = {(gpu, uuid) for gpu, uuid, _, _ in stored}
    assert len(gpus) == sum(1 for host, _ in dataset.expected if host == NODE)
    first_at, last_at = min(row[2] for row in stored), max(row[2] for row in stored)
    for gpu in gpus:
        times = [(at, covers) for g, u, at, covers in stored if (g, u) == gpu]
        # Each row covers the time since the one before (across the replacement too): the
        # first covers its window, every gap is under the window, nothing is counted twice.
        assert times[0][1] == WINDOW_SECONDS
        for (previous, _), (at, covers) in itertools.pairwise(times):
            assert covers == pytest.approx((at - previous).total_seconds(), abs=1e-6)
            assert covers < WINDOW_SECONDS
        assert times[0][0] == first_at
        assert times[-1][0] == last_at
    # The report over the whole run: every GPU covered all of it, from the rollups.
    since = first_at - timedelta(seconds=WINDOW_SECONDS)
    assert (
        main(
            [
                *("report", "--store-url", pooled, "--by", "gpu", "--output", "json"),
                *(
                    "--since",
                    f"{(last_at - since).total_seconds()}s",
                    "--until",
                    last_at.isoformat(),
                ),
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)["rows"]
    expected = (last_at - since).total_seconds() / 3600
    assert sorted(row["gpu"] for row in report) == sorted(gpu for gpu, _ in gpus)
    for row in report:
        assert row["covered_hours"] == pytest.approx(expected, abs=1e-9)
