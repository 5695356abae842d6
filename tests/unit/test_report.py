"""``gpu-profiler report`` on a known synthetic history, on SQLite and PostgreSQL.

The history (range: T0 .. T0+4h, cycles every 60 s, window 30 min) is built through the real
``TableStore`` so the covered time per row comes from the sink as in production:

- node-a GPU 0: training from T0-30m to T0+2h, then idle to T0+4h (idle fraction 0.1, then 1.0).
  The row at T0 lies on the range start and counts 0 s: training 2 h, idle 2 h, 2.2 idle GPU-h.
- node-a GPU 1: first row at T0+10m (covers a whole window, clipped to the 10 min after T0),
  then every minute to T0+1h: inference 1 h, idle fraction 0.25 -> 0.25 idle GPU-h.
- node-b GPU 0: first row at T0+3h (covers 30 min, all inside the range), bursty every minute
  to T0+5h; rows after T0+4h are outside: bursty 1.5 h, idle fraction 0.5 -> 0.75 idle GPU-h.
Pods: ml/train-a (GPU 0, T0-10m..T0+2h, busy) 2 GPU-h; ml/idle-c (GPU 0, T0+2h..T0+4h, 2 %)
2 GPU-h; dev/jupyter-d (3 GPUs on node-b, T0+3h..T0+5h, 0 %) 3 GPU-h in range; dev/gone-e
(idle, seen only before T0) is outside the range.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from profiler_app.cli import main
from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodShare,
    PodUsage,
)
from profiler_app.profiles.pods import pod_usage
from profiler_app.reports import waste as report_waste
from profiler_app.reports.history import build_report, report_rows, view_columns
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.urls import parse_store_url
from profiler_app.sources.kube_pods import pod_info
from tests.support.apiserver.objects import pod_manifest

pytest_plugins = ["tests.support.postgres"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UNTIL = T0 + timedelta(hours=4)
MINUTE = timedelta(minutes=1)
RANGE_ARGS = ["--since", "4h", "--until", "2026-01-01T04:00:00Z"]


def gpu(node: str, index: str, job_type: str, util_max: float, idle_fraction: float) -> GpuProfile:
    stats = FieldStats(max=util_max, p95=util_max, mean=util_max / 2, idle_fraction=idle_fraction)
    return GpuProfile(index, f"GPU-{node}-{index}", node, job_type, None, {GPU_UTIL: stats})


def pod(
    namespace: str, name: str, node: str, gpus: int, util: float, *, start: datetime
) -> PodUsage:
    return PodUsage(
        namespace, name, node, start, tuple(str(g) for g in range(gpus)), gpu_util_max=util
    )


def node_a_cycle(at: datetime) -> CycleResult:
    gpus, pods = [], []
    if at <= T0 + timedelta(hours=2):
        gpus.append(gpu("node-a", "0", "training", 98.0 if at.minute % 2 else 90.0, 0.1))
    else:
        gpus.append(gpu("node-a", "0", "idle", 2.0, 1.0))
    if T0 + timedelta(minutes=10) <= at <= T0 + timedelta(hours=1):
        gpus.append(gpu("node-a", "1", "inference", 80.0, 0.25))
    if T0 - timedelta(minutes=10) <= at <= T0 + timedelta(hours=2):
        pods.append(pod("ml", "train-a", "node-a", 1, 98.0, start=T0 - timedelta(minutes=10)))
    if at >= T0 + timedelta(hours=2):
        pods.append(pod("ml", "idle-c", "node-a", 1, 2.0, start=T0 + timedelta(hours=2)))
    if T0 - timedelta(minutes=30) <= at <= T0 - timedelta(minutes=20):
        pods.append(pod("dev", "gone-e", "node-a", 1, 0.0, start=T0 - timedelta(minutes=30)))
    return CycleResult("node-a", at, 1800.0, gpus, pods)


def node_b_cycle(at: datetime) -> CycleResult:
    jupyter = pod("dev", "jupyter-d", "node-b", 3, 0.0, start=T0 + timedelta(hours=3))
    return CycleResult("node-b", at, 1800.0, [gpu("node-b", "0", "bursty", 70.0, 0.5)], [jupyter])


def build_history(url: str) -> None:
    store = TableStore(url)
    at = T0 - timedelta(minutes=30)
    while at <= T0 + timedelta(hours=5):
        store.publish(node_a_cycle(at))
        if at >= T0 + timedelta(hours=3):
            store.publish(node_b_cycle(at))
        at += MINUTE
    store.close()


@pytest.fixture(scope="module")
def history_sqlite(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'profiler.db'}"
    build_history(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def history(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("history_sqlite"))
    return str(request.getfixturevalue("history_postgresql"))


@pytest.fixture(scope="module")
def history_postgresql(postgres_server: Any) -> str:
    url = str(postgres_server.create_database())
    build_history(url)
    return url


def report_for(url: str, **options: Any) -> Any:
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            return build_report(connection, since=T0, until=UNTIL, **options)
    finally:
        engine.dispose()


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["report", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_hours_per_job_type_and_idle_gpu_hours_per_gpu(history: str) -> None:
    report = report_for(history)
    got = {
        (g.node, g.gpu): (g.hours_by_job_type, g.idle_gpu_hours, g.util_max_percent)
        for g in report.gpus
    }
    approx = pytest.approx  # SQLite's julianday arithmetic is exact to ~0.1 ms
    assert got == {
        ("node-a", "0"): (
            approx({"idle": 2.0, "training": 2.0, "inference": 0.0, "bursty": 0.0}, abs=1e-6),
            approx(2.2, abs=1e-6),
            98.0,
        ),
        ("node-a", "1"): (
            approx({"idle": 0.0, "training": 0.0, "inference": 1.0, "bursty": 0.0}, abs=1e-6),
            approx(0.25, abs=1e-6),
            80.0,
        ),
        ("node-b", "0"): (
            approx({"idle": 0.0, "training": 0.0, "inference": 0.0, "bursty": 1.5}, abs=1e-6),
            approx(0.75, abs=1e-6),
            70.0,
        ),
    }


def test_node_summaries_add_up_their_gpus(history: str) -> None:
    rows = report_rows(report_for(history), "node")
    assert [(r["node"], r["gpus"], r["util_max_percent"]) for r in rows] == [
        ("node-a", 2, 98.0),
        ("node-b", 1, 70.0),
    ]
    node_a = rows[0]
    assert node_a["covered_hours"] == pytest.approx(5.0, abs=1e-6)
    assert node_a["training_hours"] == pytest.approx(2.0, abs=1e-6)
    assert node_a["idle_gpu_hours"] == pytest.approx(2.45, abs=1e-6)
    assert rows[1]["bursty_hours"] == pytest.approx(1.5, abs=1e-6)


def test_pods_and_top_idle_pods(history: str) -> None:
    report = report_for(history)
    assert [(p.namespace, p.pod, round(p.gpu_hours, 6)) for p in report.pods] == [
        ("dev", "jupyter-d", 3.0),
        ("ml", "idle-c", 2.0),
        ("ml", "train-a", 2.0),
    ]
    assert [(p.pod, p.gpus) for p in report.idle_pods] == [("jupyter-d", "0,1,2"), ("idle-c", "0")]
    assert [p.pod for p in report_for(history, top=1).idle_pods] == ["jupyter-d"]
    assert report_for(history, idle_below_percent=1.0).idle_pods[0].pod == "jupyter-d"
    assert len(report_for(history, idle_below_percent=1.0).idle_pods) == 1


def test_node_filter(history: str) -> None:
    report = report_for(history, node="node-b")
    assert [(g.node, g.gpu) for g in report.gpus] == [("node-b", "0")]
    assert [p.pod for p in report.pods] == ["jupyter-d"]


def test_cli_json_is_the_rows_of_the_view(history: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(
        capsys, "--store-url", history, *RANGE_ARGS, "--by", "idle-pods", "--output", "json"
    )
    assert (status, err) == (0, "")
    document = json.loads(out)
    assert {key: document[key] for key in ("kind", "format_version", "view", "since", "until")} == {
        "kind": "report",
        "format_version": 1,
        "view": "idle-pods",
        "since": "2026-01-01T00:00:00Z",
        "until": "2026-01-01T04:00:00Z",
    }
    rows = document["rows"]
    assert [(r["namespace"], r["pod"], r["gpus"]) for r in rows] == [
        ("dev", "jupyter-d", "0,1,2"),
        ("ml", "idle-c", "0"),
    ]
    assert rows[0]["first_seen"] == "2026-01-01T03:00:00Z"
    assert rows[0]["start_time"] == "2026-01-01T03:00:00Z"
    assert list(rows[0]) == view_columns("idle-pods")


def test_cli_csv_has_a_header_and_one_line_per_gpu(
    history: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_cli(capsys, "--store-url", history, *RANGE_ARGS, "--output", "csv")
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert out.splitlines()[0] == ",".join(view_columns("gpu"))
    assert [(r["node"], r["gpu"]) for r in rows] == [
        ("node-a", "0"),
        ("node-a", "1"),
        ("node-b", "0"),
    ]
    assert float(rows[2]["bursty_hours"]) == pytest.approx(1.5, abs=1e-6)


def test_cli_table_lists_every_node(history: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "--store-url", history, *RANGE_ARGS, "--by", "node")
    assert status == 0
    assert "Nodes, 4h up to 2026-01-01T04:00:00Z" in out
    lines = [line for line in out.splitlines() if "node-" in line]
    assert len(lines) == 2
    assert "2.45" in lines[0]
    assert "98.00" in lines[0]


@pytest.mark.parametrize(("output", "expected_out"), [("json", []), ("table", ""), ("csv", None)])
def test_no_rows_in_range_is_a_message_not_an_error(
    history_sqlite: str,
    capsys: pytest.CaptureFixture[str],
    output: str,
    expected_out: str | list[object] | None,
) -> None:
    args = ["--store-url", history_sqlite, "--since", "1h", "--until", "2025-01-01T00:00Z"]
    status, out, err = run_cli(capsys, *args, "--output", output)
    assert status == 0
    assert "no gpu data in the store between 2024-12-31T23:00:00Z and 2025-01-01T00:00:00Z" in err
    if output == "json":
        assert json.loads(out)["rows"] == expected_out
    else:
        assert out == (
            expected_out if expected_out is not None else ",".join(view_columns("gpu")) + "\n"
        )


def test_an_empty_store_reports_no_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'profiler.db'}"
    TableStore(url).close()
    status, out, err = run_cli(capsys, "--store-url", url, "--by", "pod", "--output", "json")
    assert (status, json.loads(out)["rows"]) == (0, [])
    assert "no pod data" in err


def test_store_url_comes_from_the_environment(
    history_sqlite: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_PROFILER_STORE_URL", history_sqlite)
    status, out, _ = run_cli(capsys, *RANGE_ARGS, "--by", "node", "--output", "json")
    assert status == 0
    assert [row["node"] for row in json.loads(out)["rows"]] == ["node-a", "node-b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--store-url", "sqlite:///{tmp}/missing.db"], "no store at"),
        (["--store-url", "sqlite:///{tmp}/junk.db"], "cannot read the store"),
        (["--store-url", "sqlite:///{tmp}/bare.db"], "has no gpu-profiler tables"),
        (["--store-url", "none"], "reads the table store"),
        (["--store-url", "ftp://x/y"], "unsupported store URL scheme"),
        (["--store-url", "sqlite:///{tmp}/bare.db", "--since", "yesterday"], "malformed duration"),
        (["--store-url", "sqlite:///{tmp}/bare.db", "--until", "soon"], "malformed --until"),
        (["--store-url", "sqlite:///{tmp}/bare.db", "--since", "inf"], "--since: malformed"),
        (["--store-url", "sqlite:///{tmp}/bare.db", "--since", "nan"], "--since: malformed"),
        (["--store-url", "sqlite:///{tmp}/bare.db", "--since", "1000000d"], "longer than 100"),
        (
            ["--store-url", "sqlite:///{tmp}/bare.db", "--since", "3650d", "--until", "0002-01-01"],
            "reaches back before the year 1",
        ),
        (["--store-url", "sqlite:///{tmp}/bare.db", "--top", "-1"], "--top -1: give 0"),
        (
            ["--store-url", "postgresql://u:hunter2@127.0.0.1:9/db?connect_timeout=2"],
            "database unavailable",
        ),
        (["--store-url", "sqlite:///~no-such-user-here/store.db"], "cannot expand"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "junk.db").write_text("this is not a database, just text long enough" * 50)
    sqlite3.connect(tmp_path / "bare.db").close()
    status, out, err = run_cli(capsys, *(arg.format(tmp=tmp_path) for arg in args))
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpu-profiler: error: ")
    assert message in err
    assert "hunter2" not in err


def test_help_masks_a_password_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_PROFILER_STORE_URL", "postgresql://reader:hun%40t@er2@db:5432/gpus")
    with pytest.raises(SystemExit) as exited:
        main(["report", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert "postgresql://***@db:5432/gpus" in out  # user and password, as every URL in a log
    assert "hun" not in out
    assert "er2" not in out


def pod_info_of(namespace: str, name: str, *, phase: str) -> Any:
    return pod_info(pod_manifest(namespace, name, "node-f", gpus=1, phase=phase, start_time=T0))


def waste_history(url: str) -> None:
    """One hour on node-w at 60 s cycles: GPU 0 idle with no pod; GPU 1 held by a notebook
    (StatefulSet) with 20 GiB of framebuffer and no compute; GPU 2 held by a PyTorchJob's pod,
    idle half the time, with no memory of note."""
    store = TableStore(url)
    at = T0
    while at <= T0 + timedelta(hours=1):
        gpus = [
            gpu("node-w", "0", "idle", 0.0, 1.0),
            dataclasses.replace(
                gpu("node-w", "1", "idle", 1.0, 1.0),
                stats={
                    GPU_UTIL: FieldStats(1.0, 1.0, 0.5, 1.0),
                    FB_USED: FieldStats(20_480.0, 20_480.0, 20_480.0, 0.0),
                },
                namespace="lab",
                pod="notebook-0",
                owner_kind="StatefulSet",
                owner_name="notebook",
            ),
            dataclasses.replace(
                gpu("node-w", "2", "bursty", 90.0, 0.5),
                namespace="ml",
                pod="llama-worker-0",
                owner_kind="PyTorchJob",
                owner_name="llama",
            ),
        ]
        store.publish(CycleResult("node-w", at, 1800.0, gpus, []))
        at += MINUTE
    store.close()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]
)
def test_waste_separates_unclaimed_memory_held_and_allocated_idle_hours(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'waste.db'}"
    else:
        url = str(request.getfixturevalue("postgres_server").create_database())
    waste_history(url)

    status, out, _ = run_cli(
        capsys,
        "--store-url",
        url,
        "--by",
        "waste",
        "--since",
        "1h",
        "--until",
        "2026-01-01T01:00:00Z",
        "--output",
        "json",
    )

    assert status == 0
    rows = [
        (
            row["kind"],
            row["namespace"],
            row["owner_kind"],
            row["owner_name"],
            row["gpus"],
            round(row["idle_gpu_hours"], 3),
        )
        for row in json.loads(out)["rows"]
    ]
    assert rows == [
        ("idle-no-pod", None, None, None, 1, 1.0),
        ("memory-held-compute-idle", "lab", "StatefulSet", "notebook", 1, 1.0),
        ("allocated-idle", "ml", "PyTorchJob", "llama", 1, 0.5),
    ]
    assert view_columns("waste") == list(json.loads(out)["rows"][0])


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]
)
def test_waste_top_lists_the_most_idle_of_each_kind_with_their_gpus(
    backend: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six GPUs held by pods of five workloads idle 10 % to 50 % of an hour (job-4 on two
    GPUs), and one GPU without a pod. --top 2 lists the two most idle workloads with all their
    GPUs, says how many it left out, and --top 0 lists every one. Over an hour one query ranks
    the groups and counts their GPUs; over days (whole days read from the daily rollup) the
    groups are ranked first and GPUs counted for the chosen ones: both list the same."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'waste.db'}"
    else:
        url = str(request.getfixturevalue("postgres_server").create_database())
    store = TableStore(url)
    at = T0
    while at <= T0 + timedelta(hours=1):
        gpus = [gpu("node-t", "0", "idle", 0.0, 1.0)]
        for index, job in enumerate((0, 1, 2, 3, 4, 4), start=1):
            held = gpu("node-t", str(index), "bursty", 90.0, 0.1 * (job + 1))
            gpus.append(
                dataclasses.replace(
                    held, namespace="ml", pod=f"job-{job}-{index}", owner_kind="Job",
                    owner_name=f"job-{job}",
                )
            )  # fmt: skip
        store.publish(CycleResult("node-t", at, 1800.0, gpus, []))
        at += MINUTE
    store.close()
    arguments = ["--store-url", url, "--by", "waste"]
    arguments += ["--until", "2026-01-01T01:00:00Z", "--output", "json"]

    def listed(top: str, since: str = "1h") -> tuple[list[tuple[Any, ...]], str]:
        status, out, err = run_cli(capsys, *arguments, "--since", since, "--top", top)
        assert status == 0
        rows = [
            (row["kind"], row["owner_name"], row["gpus"], round(row["idle_gpu_hours"], 3))
            for row in json.loads(out)["rows"]
        ]
        return rows, err

    rows, err = listed("2")
    assert rows == [
        ("idle-no-pod", None, 1, 1.0),
        ("allocated-idle", "job-4", 2, 1.0),
        ("allocated-idle", "job-3", 1, 0.4),
    ]
    assert "waste lists the 2 largest of each kind; --top 0 also lists 3 of allocated-idle" in err
    # Three days (more of the first cycle's 30-minute window inside): ranked, then counted.
    over_days, err_over_days = listed("2", "3d")
    assert over_days == listed("0", "3d")[0][:3]
    assert [row[:3] for row in over_days] == [row[:3] for row in rows]
    assert err_over_days == err
    # Too many listed workloads to filter the rows by name: every group's GPUs are counted.
    monkeypatch.setattr(report_waste, "_OWNERS_FILTERED", 0)
    assert listed("2", "3d")[0] == over_days
    rows, err = listed("0")
    assert [row[1] for row in rows] == [None, "job-4", "job-3", "job-2", "job-1", "job-0"]
    assert rows[1] == ("allocated-idle", "job-4", 2, 1.0)
    assert "--top 0" not in err


@pytest.mark.integration
def test_waste_over_hours_plans_its_ranking_without_sorts_and_puts_the_setting_back(
    postgres_server: Any,
) -> None:
    """PostgreSQL sorted the per-GPU groups of a day's hours where hashing is faster
    (``_grouping_by_hashing``): the ranking statement alone runs with sorts off, and the
    transaction has them on again afterwards, for the report's other statements."""
    url = str(postgres_server.create_database())
    waste_history(url)
    engine = create_store_engine(parse_store_url(url), create_file=False)
    statements: list[str] = []
    event.listen(
        engine, "before_cursor_execute", lambda *args: statements.append(" ".join(args[2].split()))
    )
    try:
        with engine.connect() as connection:
            report = build_report(
                connection,
                since=T0,
                until=T0 + timedelta(hours=1),
                views=("waste",),
                top=10,
            )
            sorting = connection.exec_driver_sql("SHOW enable_sort").scalar()
    finally:
        engine.dispose()
    assert [(w.kind, w.owner_name, w.gpus) for w in report.waste] == [
        ("idle-no-pod", None, 1),
        ("memory-held-compute-idle", "notebook", 1),
        ("allocated-idle", "llama", 1),
    ]
    assert sorting == "on"
    off = statements.index("SET LOCAL enable_sort = off")
    assert statements[off + 1].startswith("WITH grouped AS")
    assert statements[off + 2] == "SET LOCAL enable_sort TO DEFAULT"
    assert statements.count("SET LOCAL enable_sort = off") == 1


def test_waste_lists_equal_idle_hours_by_name_whatever_order_the_database_gives() -> None:
    """PostgreSQL's grouping returns groups in no set order; ties must not follow it."""
    rows = [(1, "team", "Job", name, 1, 3600.0) for name in ("job-c", "job-a", "job-b")] + [
        (1, "team", "Job", "job-z", 2, 7200.0),
        (0, "", "", "", 8, 3600.0),
    ]

    listed = report_waste._summaries(rows)

    assert [(w.kind, w.owner_name) for w in listed] == [
        ("idle-no-pod", None),
        *(("memory-held-compute-idle", name) for name in ("job-z", "job-a", "job-b", "job-c")),
    ]


def test_a_finished_pod_stays_in_the_pod_report(tmp_path: Path) -> None:
    """A Job's pod used GPU 0 for 20 minutes and finished (phase Succeeded); its series stay in
    the window for another 30 minutes with no pod after them. The daemon's path (pod_usage ->
    store) keeps the pod, its GPU and its 20 minutes, not the 50 its series were visible."""
    url = f"sqlite:///{tmp_path / 'finished.db'}"
    store = TableStore(url)
    started = T0
    ended = T0 + timedelta(minutes=20)
    running = pod_info_of("ml", "eval-7", phase="Running")
    finished = dataclasses.replace(running, phase="Succeeded")
    at = T0 + MINUTE
    while at <= T0 + timedelta(minutes=50):
        share = PodShare("ml", "eval-7", 0.5, started.timestamp(), min(at, ended).timestamp())
        current = at <= ended
        profile = dataclasses.replace(
            gpu("node-f", "0", "training" if current else "idle", 95.0, 0.1),
            namespace="ml" if current else None,
            pod="eval-7" if current else None,
            pods=(share,),
        )
        usage = pod_usage([profile], [running if current else finished], {}, "node-f")
        store.publish(CycleResult("node-f", at, 1800.0, [profile], usage))
        at += MINUTE
    store.close()

    [row] = report_rows(report_for(url), "pod")

    assert (row["pod"], row["gpus"]) == ("eval-7", "0")
    assert row["gpu_hours"] == pytest.approx(20 / 60)
    assert row["last_seen"] == ended


def test_the_reports_job_types_are_the_classifiers() -> None:
    from profiler_app.analysis.basis import JobType  # noqa: PLC0415
    from profiler_app.reports.history import JOB_TYPES  # noqa: PLC0415

    assert tuple(job_type.value for job_type in JobType) == JOB_TYPES


@pytest.mark.parametrize("view", ["node", "gpu", "pod", "idle-pods", "waste", "trace", "trial"])
def test_the_store_views_never_load_numpy(history_sqlite: str, view: str) -> None:
    """numpy is a sixth of report's start-up; no history view computes with arrays. (Right-sizing
    does: it sums a month of packed histograms with numpy, reports/histograms.py.)"""
    probe = (
        "import sys; from profiler_app.cli import main; "
        f"main(['report', '--store-url', {history_sqlite!r}, '--by', {view!r}, "
        f"'--until', {UNTIL.isoformat()!r}, '--since', '30d', '-o', 'json']); "
        "print('numpy' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )

    assert (done.returncode, done.stderr.splitlines()[-1]) == (0, "False")
    assert json.loads(done.stdout)["view"] == view
