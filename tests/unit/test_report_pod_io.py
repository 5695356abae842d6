"""``gpu-profiler report --by pod`` shows pods' disk and network rates (table, JSON, CSV), on
SQLite and PostgreSQL, from rows the real ``TableStore`` wrote."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest

from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    NETWORK_RECEIVE,
    NETWORK_TRANSMIT,
    CycleResult,
    IoRates,
    RateStats,
)
from profiler_app.reports.history import view_columns
from profiler_app.sinks.store import TableStore
from tests.support.store_cycles import pod
from tests.unit.test_report import MINUTE, T0, gpu, run_cli

pytest_plugins = ["tests.support.postgres"]

MIB = 2.0**20
RANGE = ["--since", "1h", "--until", "2026-01-01T01:00:00Z", "--by", "pod"]


@pytest.fixture
def history(store_url: str) -> str:
    """ml/train-0 reads 512 MiB/s at peak and receives 64; ml/host-1 is on the host's network."""
    store = TableStore(store_url)
    measured = IoRates(
        {
            DISK_READ: RateStats(512 * MIB, 128 * MIB),
            DISK_WRITE: RateStats(32 * MIB, 8 * MIB),
            NETWORK_RECEIVE: RateStats(64 * MIB, 48 * MIB),
            NETWORK_TRANSMIT: RateStats(16 * MIB, 4 * MIB),
        }
    )
    hidden = IoRates({DISK_READ: RateStats(1 * MIB, 1 * MIB)}, network_attributable=False)
    at = T0 + MINUTE
    while at <= T0 + timedelta(minutes=30):
        profile = gpu("node-a", "0", "training", 95.0, 0.1)
        pods = [pod("train-0", io=measured), pod("host-1", io=hidden)]
        store.publish(CycleResult("node-a", at, 1800.0, [profile], pods))
        at += MINUTE
    store.close()
    return store_url


def test_json_rows_carry_each_direction_and_whether_the_network_counts(
    history: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(capsys, "--store-url", history, *RANGE, "--output", "json")
    assert (status, err) == (0, "")
    rows = {row["pod"]: row for row in json.loads(out)["rows"]}
    train = rows["train-0"]
    assert train["disk_read_max_bytes_per_second"] == 512 * MIB
    assert train["disk_read_p95_bytes_per_second"] == 128 * MIB
    assert train["network_receive_p95_bytes_per_second"] == 48 * MIB
    assert train["network_transmit_max_bytes_per_second"] == 16 * MIB
    assert train["network_attributable"] is True
    host = rows["host-1"]
    assert host["network_receive_max_bytes_per_second"] is None
    assert host["network_attributable"] is False
    assert list(train) == view_columns("pod")


def test_csv_has_the_columns(history: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "--store-url", history, *RANGE, "--output", "csv")
    assert status == 0
    rows = {row["pod"]: row for row in csv.DictReader(io.StringIO(out))}
    assert float(rows["train-0"]["disk_write_max_bytes_per_second"]) == 32 * MIB
    assert rows["host-1"]["network_transmit_max_bytes_per_second"] == ""


def test_the_table_shows_input_peaks_in_mib_per_second(
    history: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_cli(capsys, "--store-url", history, *RANGE)
    assert status == 0
    header = next(line for line in out.splitlines() if "NAMESPACE" in line)
    assert "DISK READ MAX MiB/s" in header
    assert "NETWORK RECEIVE MAX MiB/s" in header
    train = next(line for line in out.splitlines() if "train-0" in line)
    assert "512.00" in train
    assert "64.00" in train
    status, wide, _ = run_cli(capsys, "--store-url", history, *RANGE, "--output", "wide")
    assert "NETWORK TRANSMIT P95 MiB/s" in wide
    assert "NETWORK ATTRIBUTABLE" in wide
