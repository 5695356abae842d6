"""``gpu-profiler trace`` end to end: its JSON and table output, the rows it records in the table
store (SQLite; PostgreSQL under ``integration``, the real server of tests/support/postgres.py),
migration 0002, and ``gpu-profiler report --by trace``.

Reports are test doubles built by ``tests.support.nsys.builder.ReportBuilder`` with the
documented Nsight Systems export schema (no GPU or nsys here).
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from profiler_app.cli import main
from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.reports.history import view_columns
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import alembic_config, create_store_engine
from profiler_app.sinks.store.urls import parse_store_url
from tests.support.nsys.builder import NCCL_ALL_REDUCE, ReportBuilder
from tests.support.nsys.schema import HTOD, PAGEABLE

pytest_plugins = ["tests.support.postgres"]

US = 1_000
MS = 1_000_000
STARTED = datetime(2026, 1, 1, tzinfo=UTC)  # the builder's capture start


def training_report(path: Path, *, gpus: int = 2, session_start: int | None = None) -> Path:
    """Input-bound steps of 25 ms (10 ms of kernels, then waiting) on ``gpus`` GPUs."""
    report = ReportBuilder(
        gpus={device: f"NVIDIA H100 80GB HBM3 #{device}" for device in range(gpus)},
        session_start_utc_ns=session_start,
    )
    for device in range(gpus):
        for step in range(30):
            base = step * 25 * MS
            report.add_kernels("sm90_xmma_gemm", base + np.arange(10) * MS, 990 * US, device=device)
            report.add_copies(HTOD, [base + 10 * MS], 200 * US, 4 << 20, device=device)
    report.add_copies(HTOD, [900 * MS], MS, 1 << 20, host_kind=PAGEABLE)
    report.add_api_calls("cudaStreamSynchronize_v3020", [100 * MS], [101 * MS])
    return report.write(path)


@pytest.fixture
def report_path(tmp_path: Path) -> Path:
    return training_report(tmp_path / "report.sqlite", session_start=1_767_225_600_000_000_000)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_json_output_has_the_stable_keys(
    report_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(
        capsys, "trace", str(report_path), "--store-url", "none", "--output", "json"
    )
    assert (status, err) == (0, "")
    result = json.loads(out)
    assert isinstance(result["span_seconds"], float)
    assert result["iteration_seconds"] == pytest.approx(0.025, rel=0.02)
    assert [gpu["device"] for gpu in result["gpus"]] == [0, 1]
    gpu = result["gpus"][0]
    assert isinstance(gpu["busy_fraction"], float)
    assert set(gpu["idle_gaps"]) >= {"count", "total_seconds", "longest_seconds"}
    assert isinstance(gpu["idle_gaps"]["count"], int)
    kernel = gpu["kernels"][0]
    assert (kernel["name"], kernel["instances"], kernel["total_ns"]) == (
        "sm90_xmma_gemm",
        300,
        300 * 990 * US,
    )
    assert {op["kind"] for op in gpu["memory_ops"]} == {"HtoD"}
    assert gpu["verdict"] == "input-bound"
    assert all(isinstance(line, str) for line in gpu["evidence"])
    assert result["gpus"][1]["memory_ops"][0]["pageable_count"] == 0
    assert result["gpus"][0]["memory_ops"][0]["pageable_count"] == 1


def test_table_output_names_each_gpu_its_verdict_and_tables(
    report_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "trace", str(report_path), "--store-url", "none")
    assert status == 0
    assert "export schema 3.16.1" in out
    assert "GPU 0 NVIDIA H100 80GB HBM3 #0  verdict: input-bound" in out
    assert "GPU 1 NVIDIA H100 80GB HBM3 #1  verdict: input-bound" in out
    assert "try: Feed the GPU faster" in out
    for title in ("Top kernels, GPU 0", "Memory operations, GPU 1", "Longest idle gaps, GPU 0"):
        assert title in out
    assert "cudaStreamSynchronize *" in out


def test_no_gpu_activity_is_a_message_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = ReportBuilder()
    report.add_api_calls("cudaGetDeviceCount_v3020", [0], [5 * US])
    path = report.write(tmp_path / "cpu-only.sqlite")
    store = tmp_path / "store.db"
    status, out, err = run(
        capsys, "trace", str(path), "--store-url", f"sqlite:///{store}", "--output", "json"
    )
    assert status == 0
    assert json.loads(out)["gpus"] == []
    assert "holds no CUDA kernels, copies or memsets" in err
    assert fetch(f"sqlite:///{store}", "SELECT count(*) FROM trace_gpu") == [(0,)]


def fetch(url: str, query: str) -> list[tuple[Any, ...]]:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(query))]
    finally:
        engine.dispose()


def publish_training_period(url: str, period: float) -> None:
    """The continuous profiler's row for ml/train-0: training with ``period`` seconds."""
    stats = {GPU_UTIL: FieldStats(max=99.0, p95=98.0, mean=60.0, idle_fraction=0.2)}
    profile = GpuProfile(
        "0", "GPU-0", "gpu-node-7", "training", period, stats, namespace="ml", pod="train-0"
    )
    store = TableStore(url)
    store.publish(CycleResult("gpu-node-7", STARTED, 1800.0, [profile], []))
    store.close()


def test_rows_are_recorded_per_gpu_keyed_by_pod_node_and_start(
    report_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    publish_training_period(store_url, 0.0251)
    args = ["trace", str(report_path), "--store-url", store_url, "--pod", "ml/train-0"]
    status, out, _ = run(capsys, *args, "--node", "gpu-node-7", "--output", "json")
    assert status == 0
    assert json.loads(out)["profiler_period_seconds"] == 0.0251
    rows = fetch(
        store_url,
        "SELECT namespace, pod, node, device, verdict, profiler_period_seconds, top_kernel, "
        "kernel_count, gpu_name FROM trace_gpu ORDER BY device",
    )
    assert rows == [
        (
            *("ml", "train-0", "gpu-node-7", device, "input-bound", 0.0251, "sm90_xmma_gemm"),
            300,
            gpu,
        )
        for device, gpu in enumerate(["NVIDIA H100 80GB HBM3 #0", "NVIDIA H100 80GB HBM3 #1"])
    ]
    # Tracing the same report again replaces its rows; another pod adds its own.
    assert run(capsys, *args, "--node", "gpu-node-7")[0] == 0
    assert run(capsys, "trace", str(report_path), "--store-url", store_url)[0] == 0
    assert fetch(
        store_url, "SELECT pod, node, count(*) FROM trace_gpu GROUP BY 1, 2 ORDER BY 1"
    ) == [
        ("", "", 2),
        ("train-0", "gpu-node-7", 2),
    ]
    engine = create_store_engine(parse_store_url(store_url), create_file=False)
    with engine.connect() as connection:
        started = connection.execute(sa.text("SELECT DISTINCT started_at FROM trace_gpu")).all()
    engine.dispose()
    assert len(started) == 1


def by_trace(
    capsys: pytest.CaptureFixture[str], store_url: str, *args: str
) -> tuple[int, str, str]:
    return run(capsys, "report", "--by", "trace", "--store-url", store_url, *args)


def test_report_by_trace_lists_the_recorded_traces(
    report_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for pod, node in (("ml/train-0", "gpu-node-7"), ("ml/train-1", "gpu-node-8")):
        args = ["trace", str(report_path), "--store-url", store_url, "--pod", pod, "--node", node]
        assert run(capsys, *args)[0] == 0
    window = ["--since", "1h", "--until", "2026-01-01T00:30:00Z"]
    status, out, err = by_trace(capsys, store_url, *window, "--output", "json")
    assert (status, err) == (0, "")
    rows = json.loads(out)["rows"]
    assert list(rows[0]) == view_columns("trace")
    assert [(r["pod"], r["node"], r["device"], r["verdict"]) for r in rows] == [
        ("train-0", "gpu-node-7", 0, "input-bound"),
        ("train-0", "gpu-node-7", 1, "input-bound"),
        ("train-1", "gpu-node-8", 0, "input-bound"),
        ("train-1", "gpu-node-8", 1, "input-bound"),
    ]
    assert rows[0]["started_at"] == "2026-01-01T00:00:00Z"
    assert rows[0]["iteration_seconds"] == pytest.approx(0.025, rel=0.02)
    _, out, _ = by_trace(capsys, store_url, *window, "--node", "gpu-node-8", "--output", "csv")
    assert [r["pod"] for r in csv.DictReader(io.StringIO(out))] == ["train-1", "train-1"]
    before = ["--since", "1h", "--until", "2025-06-01T00:00:00Z"]
    status, out, err = by_trace(capsys, store_url, *before)
    assert (status, out) == (0, "")
    assert "no trace data in the store" in err
    _, out, _ = by_trace(capsys, store_url, *window)
    assert "Nsight Systems traces" in out
    assert "input-bound" in out


def test_a_report_without_a_capture_start_is_stored_under_its_file_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = training_report(tmp_path / "undated.sqlite", gpus=1)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    status, _, err = run(capsys, "trace", str(path), "--store-url", url)
    assert status == 0
    assert "no capture start time" in err
    stored = fetch(url, "SELECT started_at FROM trace_gpu")
    assert len(stored) == 1


def test_store_none_writes_nothing(
    report_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert run(capsys, "trace", str(report_path), "--store-url", "none")[0] == 0
    assert not (tmp_path / "data").exists()


def test_migration_0002_adds_trace_gpu_after_0001_and_removes_only_it(store_url: str) -> None:
    # 0002 follows 0001 (later revisions, such as 0003, follow 0002).
    assert (
        ScriptDirectory.from_config(alembic_config()).get_revision("0002").down_revision == "0001"
    )
    engine = create_store_engine(parse_store_url(store_url), create_file=True)
    config = alembic_config()

    def migrate(action: Any, revision: str) -> set[str]:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            action(config, revision)
        with engine.connect() as connection:
            return set(sa.inspect(connection).get_table_names())

    assert migrate(command.upgrade, "0001") == {"alembic_version", "gpu_window", "pod_usage"}
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO gpu_window (at, node, gpu, uuid, job_type, window_seconds, "
                "covers_seconds) VALUES (:at, 'n', '0', 'GPU-0', 'idle', 1800, 1800)"
            ),
            {"at": datetime(2026, 1, 1)},
        )
    assert "trace_gpu" in migrate(command.upgrade, "0002")
    with engine.connect() as connection:
        indexes = sa.inspect(connection).get_indexes("trace_gpu")
        primary = sa.inspect(connection).get_pk_constraint("trace_gpu")
    assert [index["column_names"] for index in indexes] == [["started_at"]]
    assert primary["constrained_columns"] == ["namespace", "pod", "node", "started_at", "device"]
    assert "trace_gpu" not in migrate(command.downgrade, "0001")
    with engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM gpu_window")).scalar() == 1
    engine.dispose()


def communication_report(path: Path) -> Path:
    """Each 16 ms step: 10 ms of GEMM, then an all-reduce of 6 ms on the same stream."""
    report = ReportBuilder()
    starts = np.arange(20) * 16 * MS
    report.add_kernels("sm90_xmma_gemm", starts, 10 * MS)
    report.add_collectives(NCCL_ALL_REDUCE, starts + 10 * MS, 6 * MS)
    return report.write(path)


def test_a_communication_bound_verdict_is_stored_whole(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """19 characters: more than trace_gpu.verdict held before revision 0005
    (PostgreSQL refused the row)."""
    path = communication_report(tmp_path / "r.sqlite")
    status, _, err = run(capsys, "trace", str(path), "--store-url", store_url, "--pod", "ml/w-0")
    assert (status, err) == (0, "")
    assert fetch(store_url, "SELECT verdict FROM trace_gpu") == [("communication-bound",)]
    window = ["--since", "1h", "--until", "2026-01-01T00:30:00Z", "--output", "json"]
    _, out, _ = by_trace(capsys, store_url, *window)
    assert [row["verdict"] for row in json.loads(out)["rows"]] == ["communication-bound"]


def test_the_verdict_column_widens_and_narrows_again(store_url: str) -> None:
    engine = create_store_engine(parse_store_url(store_url), create_file=True)
    config = alembic_config()

    def migrate(action: Any, revision: str) -> None:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            action(config, revision)

    def verdict_length() -> int | None:
        with engine.connect() as connection:
            columns = sa.inspect(connection).get_columns("trace_gpu")
        (column,) = [c for c in columns if c["name"] == "verdict"]
        return getattr(column["type"], "length", None)

    migrate(command.upgrade, "0003")
    assert verdict_length() == 16
    migrate(command.upgrade, "0005")
    assert verdict_length() == 32
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO trace_gpu (namespace, pod, node, started_at, device, report, "
                "recorded_at, span_seconds, busy_fraction, idle_gap_count, idle_total_seconds, "
                "idle_longest_seconds, kernel_count, kernel_seconds, memory_seconds, memory_bytes, "
                "pageable_seconds, launch_api_seconds, sync_api_seconds, verdict, evidence) "
                "VALUES ('', '', '', :at, 0, 'r', :at, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, "
                "'communication-bound', '')"
            ),
            {"at": STARTED},
        )
    migrate(command.downgrade, "0003")
    assert verdict_length() == 16
    assert fetch(store_url, "SELECT verdict FROM trace_gpu") == [("communication-bo",)]
    engine.dispose()
