"""``gpu-profiler report --by rightsize``: the right-sizing engine on the store's history, in
every output (table, JSON, CSV, the Prometheus metric), on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from profiler_app.cli import main
from profiler_app.reports.rightsize import weighted_quantile
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import store_horizon
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.store_rows import write_rows

pytest_plugins = ["tests.support.postgres"]

UNTIL = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
STEP = timedelta(minutes=5)
H100 = "NVIDIA H100 80GB HBM3"


def rows_of(
    workload: str,
    hours: float,
    *,
    fb_mib: float,
    sm_p95: float | None,
    sm_mean: float | None = None,
    idle: float = 0.1,
    model: str = H100,
    mig_profile: str | None = None,
    gpu_i_id: str = "",
) -> list[dict[str, Any]]:
    """A training workload's rows every 5 minutes over ``hours``, its period found."""
    count = int(hours * 3600 / STEP.total_seconds())
    return [
        {
            "at": UNTIL - STEP * step,
            "node": "node-a",
            "gpu": "0",
            "uuid": f"GPU-{workload}",
            "gpu_i_id": gpu_i_id,
            "job_type": "training",
            "period_seconds": 12.0,
            "window_seconds": 1800.0,
            "covers_seconds": 300.0,
            "util_max": 90.0,
            "util_idle_fraction": idle,
            "fb_used_max_mib": fb_mib,
            "namespace": "ml",
            "pod": f"{workload}-0",
            "owner_kind": "PyTorchJob",
            "owner_name": workload,
            "gpu_model": model,
            "mig_profile": mig_profile,
            "sm_active_p95": sm_p95,
            "sm_active_mean": sm_mean if sm_mean is not None else sm_p95,
            "dram_active_p95": 0.1 if sm_p95 is not None else None,
        }
        for step in range(count)
    ]


@pytest.fixture
def store(store_url: str) -> str:
    rows = [
        # The docs' worked example: 9 GiB peak, 20 % SM activity on an H100 SXM5.
        *rows_of("example", 25, fb_mib=9 * 1024, sm_p95=0.2),
        *rows_of("young", 2, fb_mib=1024, sm_p95=0.5),
        *rows_of("no-sm", 25, fb_mib=1024, sm_p95=None),
        *rows_of("big", 25, fb_mib=70 * 1024, sm_p95=0.9),
        *rows_of("idle", 25, fb_mib=2048, sm_p95=0.05, idle=0.9),
    ]
    write_rows(store_url, rows)
    return store_url


def report(capsys: pytest.CaptureFixture[str], url: str, *arguments: str) -> tuple[str, str]:
    base = ["report", "--store-url", url, "--by", "rightsize", "--until", "2026-11-26T12:00Z"]
    status = main([*base, "--since", "2d", *arguments])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out, captured.err


def test_json_gives_each_workload_its_advice(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    out, _ = report(capsys, store, "--output", "json")
    document = json.loads(out)
    assert (document["kind"], document["view"]) == ("report", "rightsize")
    by_name = {row["workload"]: row for row in document["rows"]}
    assert set(by_name) == {"example", "young", "no-sm", "big", "idle"}
    example = by_name["example"]
    assert (example["verdict"], example["recommends"]) == ("MIG", "2g.20gb")
    assert example["needs"]["memory_gib"] == pytest.approx(9 * 1.15)
    assert example["needs"]["sms"] == pytest.approx(0.2 * 132)
    assert by_name["young"]["verdict"] == "not enough history"
    assert by_name["no-sm"]["reason"].startswith("no SM activity in the store")
    assert by_name["big"]["recommends"] == "full-gpu"
    assert by_name["idle"]["recommends"] == "time-slicing"


def test_table_and_csv_and_the_trial_hint(capsys: pytest.CaptureFixture[str], store: str) -> None:
    out, err = report(capsys, store)
    lines = out.splitlines()
    assert lines[0].startswith("Right-sizing advice, 2d up to 2026-11-26T12:00:00Z")
    example = next(line for line in lines if line.startswith("ml") and " example " in line)
    assert "2g.20gb" in example
    assert "10.4" in example  # GiB, the docs' figure
    assert "26.4" in example  # SMs
    assert "gpu-profiler trial plan" in err
    out, _ = report(capsys, store, "--output", "csv")
    records = list(csv.DictReader(io.StringIO(out)))
    assert {record["workload"]: record["recommends"] for record in records}["example"] == "2g.20gb"


def test_the_metric_in_the_text_exposition_format(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    out, _ = report(capsys, store, "--output", "prometheus")
    samples = [line for line in out.splitlines() if not line.startswith("#")]
    assert "# TYPE gpu_profiler_rightsize_recommendation gauge" in out
    assert (
        'gpu_profiler_rightsize_recommendation{namespace="ml",workload="example",'
        'profile="2g.20gb"} 1'
    ) in samples
    # No advice, no sample: young and no-sm.
    assert len(samples) == 3


def test_a_larger_headroom_needs_more_memory(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    out, _ = report(capsys, store, "--output", "json", "--headroom", "1.5")
    example = next(row for row in json.loads(out)["rows"] if row["workload"] == "example")
    assert example["needs"]["memory_gib"] == pytest.approx(9 * 2.5)
    assert example["recommends"] == "3g.40gb"


def test_top_advises_the_workloads_with_the_most_gpu_hours(
    capsys: pytest.CaptureFixture[str], store_url: str
) -> None:
    # Twelve workloads, w11 with the most hours: more than the default 10.
    write_rows(
        store_url,
        [row for i in range(12) for row in rows_of(f"w{i:02}", 24 + i, fb_mib=1024, sm_p95=0.2)],
    )
    most_first = [f"w{i:02}" for i in range(11, -1, -1)]
    out, err = report(capsys, store_url, "--output", "json")
    assert [row["workload"] for row in json.loads(out)["rows"]] == most_first[:10]
    note = "rightsize advises the 10 workloads with the most GPU-hours; --top 0 also advises 2"
    assert f"gpu-profiler: note: {note}" in err
    out, err = report(capsys, store_url, "--output", "json", "--top", "0")
    assert [row["workload"] for row in json.loads(out)["rows"]] == most_first
    assert "note" not in err
    # A metric's consumers get every workload unless --top says otherwise.
    out, _ = report(capsys, store_url, "--output", "prometheus")
    samples = [line for line in out.splitlines() if not line.startswith("#")]
    assert [sample.split('workload="')[1].split('"')[0] for sample in samples] == most_first
    out, _ = report(capsys, store_url, "--output", "prometheus", "--top", "3")
    assert len([line for line in out.splitlines() if not line.startswith("#")]) == 3


def test_bad_options_are_one_line(capsys: pytest.CaptureFixture[str], store: str) -> None:
    base = ["report", "--store-url", store]
    assert main([*base, "--by", "gpu", "--output", "prometheus"]) == 2
    assert "--output prometheus is for --by rightsize" in capsys.readouterr().err
    assert main([*base, "--by", "rightsize", "--headroom", "-1"]) == 2
    assert "--headroom -1: a fraction of the peak from 0 to 2" in capsys.readouterr().err


def test_weighted_quantile() -> None:
    assert weighted_quantile([1.0, 2.0, 3.0], [1, 1, 1], 0.5) == 2.0
    assert weighted_quantile([1.0, 2.0, 3.0], [1, 1, 8], 0.5) == 3.0
    assert weighted_quantile([float("nan"), 5.0], [10, 1], 0.95) == 5.0
    assert weighted_quantile([], [], 0.5) != weighted_quantile([], [], 0.5)  # NaN


def test_one_node_reads_its_raw_rows_to_the_same_advice(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    everything = json.loads(report(capsys, store, "--output", "json")[0])["rows"]
    node_a = json.loads(report(capsys, store, "--output", "json", "--node", "node-a")[0])["rows"]
    assert node_a == everything
    out, err = report(capsys, store, "--output", "json", "--node", "node-b")
    assert json.loads(out)["rows"] == []
    assert "no workload on a GPU in the store" in err


def test_one_node_says_what_retention_left_out(
    capsys: pytest.CaptureFixture[str], store: str
) -> None:
    """The rollups do not know nodes: --node advises from the raw rows kept, and says so."""
    engine = create_store_engine(parse_store_url(store), create_file=False)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(store_horizon).values(
                table_name="gpu_window", removed_before=UNTIL - timedelta(hours=1)
            )
        )
    engine.dispose()
    out, err = report(capsys, store, "--output", "json", "--node", "node-a")
    assert "removed by retention: --node advises from the time after it" in err
    rows = {row["workload"]: row for row in json.loads(out)["rows"]}
    assert rows["example"]["verdict"] == "not enough history"  # one hour left of 25
