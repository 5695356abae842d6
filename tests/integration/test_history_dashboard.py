"""The "GPU history" Grafana dashboard (infra/monitoring/dashboards/gpu-history.json) on a real
PostgreSQL holding a known history written by the daemon's real write path.

Every panel's and variable's SQL runs as Grafana would send it: dashboard variables interpolated
as Grafana's SQL data sources format them (a multi-value variable as a quoted list, a single
value with its quotes doubled), then the PostgreSQL data source's macros expanded as its macro
engine does (``$__timeFilter(col)`` -> ``col BETWEEN 'from' AND 'to'`` in RFC 3339,
``$__timeGroupAlias(col, 1h)`` -> ``floor(extract(epoch from col)/3600)*3600 AS "time"``,
``$__interval`` -> the interval Grafana picked, e.g. ``1h``). The numbers are checked against
the history's own.

The history (3 hours from T0, a cycle a minute, the first at T0 + 30 min covering its window):
node-a GPU 0 trains (pod ml/train-0 of PyTorchJob llama, period 12 s the first hour, 15 s the
second, idle fraction 0.1) to T0 + 2 h, then sits idle with no pod; node-a GPU 1 is held idle by
lab/notebook-0 (StatefulSet notebook, 2 GiB of memory); node-b GPU 0 serves for serve/web-0
(Deployment web, idle fraction 0.5).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from profiler_app.core.model import FB_USED, GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.sinks.store import TableStore

if TYPE_CHECKING:
    from tests.support.postgres import PostgresServer

pytest_plugins = ["tests.support.postgres"]
pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).parents[2] / "infra/monitoring/dashboards/gpu-history.json"
DATASOURCE = {"type": "grafana-postgresql-datasource", "uid": "gpu-profiler-store"}
T0 = datetime(2026, 11, 20, 6, 0, tzinfo=UTC)
END = T0 + timedelta(hours=3)
HOUR = 3600.0


def gpu(node: str, index: str, job_type: str, **details: Any) -> GpuProfile:
    util, idle, fb = details.pop("util"), details.pop("idle"), details.pop("fb", 500.0)
    stats = {
        GPU_UTIL: FieldStats(util, util, util / 2, idle),
        FB_USED: FieldStats(fb, fb, fb, 0.0),
    }
    period = details.pop("period", None)
    return GpuProfile(index, f"GPU-{node}-{index}", node, job_type, period, stats, **details)


def write_history(url: str) -> None:
    store = TableStore(url)
    at = T0 + timedelta(minutes=30)
    while at <= END:
        if at <= T0 + timedelta(hours=2):
            period = 12.0 if at <= T0 + timedelta(hours=1) else 15.0
            first = gpu(
                "node-a", "0", "training", util=98.0, idle=0.1, fb=30000.0, period=period,
                namespace="ml", pod="train-0", owner_kind="PyTorchJob", owner_name="llama",
            )  # fmt: skip
        else:
            first = gpu("node-a", "0", "idle", util=1.0, idle=1.0)
        notebook = gpu(
            "node-a", "1", "idle", util=0.0, idle=1.0, fb=2048.0,
            namespace="lab", pod="notebook-0", owner_kind="StatefulSet", owner_name="notebook",
        )  # fmt: skip
        server = gpu(
            "node-b", "0", "inference", util=80.0, idle=0.5, fb=9000.0,
            namespace="serve", pod="web-0", owner_kind="Deployment", owner_name="web",
        )  # fmt: skip
        store.publish(CycleResult("node-a", at, 1800.0, [first, notebook]))
        store.publish(CycleResult("node-b", at, 1800.0, [server]))
        at += timedelta(minutes=1)
    store.close()


@pytest.fixture(scope="module")
def history(postgres_server: PostgresServer) -> str:
    url = postgres_server.create_database()
    write_history(url)
    return url


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def rfc3339(moment: datetime) -> str:
    """Go's time.RFC3339Nano of a UTC time, as the macro engine writes it."""
    text = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def grafana_sql(sql: str, variables: dict[str, list[str] | str], interval: str) -> str:
    """``sql`` as Grafana sends it for the range T0 .. END (see the module docstring)."""

    def variable(match: re.Match[str]) -> str:
        value = variables[match[1] or match[2]]
        if isinstance(value, list):  # multi-value: each quoted, joined by commas
            return ",".join("'" + item.replace("'", "''") + "'" for item in value)
        return value.replace("'", "''")

    sql = sql.replace("$__interval", interval)
    sql = re.sub(r"\$\{(\w+)\}|\$(?!__)(\w+)", variable, sql)
    seconds = {"1h": 3600, "2h": 7200, "1d": 86400}

    def macro(match: re.Match[str]) -> str:
        name, args = match[1], [arg.strip() for arg in match[2].split(",")]
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{rfc3339(T0)}' AND '{rfc3339(END)}'"
        if name in {"__timeGroup", "__timeGroupAlias"}:
            step = seconds[args[1].strip("'")]
            group = f"floor(extract(epoch from {args[0]})/{step})*{step}"
            return group + (' AS "time"' if name == "__timeGroupAlias" else "")
        raise AssertionError(f"macro {name} not expanded by this test")

    return re.sub(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)", macro, sql)


def run(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        return [tuple(row) for row in connection.execute(sql)]  # type: ignore[arg-type]


def panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    (found,) = [p for p in dashboard["panels"] if p["title"] == title]
    return found


def query(
    url: str,
    dashboard: dict[str, Any],
    title: str,
    *,
    nodes: list[str] | None = None,
    interval: str = "1h",
    **variables: str,
) -> list[tuple[Any, ...]]:
    (target,) = panel(dashboard, title)["targets"]
    values: dict[str, list[str] | str] = {"node": nodes or ["node-a", "node-b"], "idle_below": "5"}
    values.update(variables)
    return run(url, grafana_sql(target["rawSql"], values, interval))


def series(rows: list[tuple[Any, ...]]) -> dict[str, list[tuple[float, float]]]:
    """Grafana's long time-series frame (time, metric, value) as one series per metric, time in
    hours from T0."""
    out: dict[str, list[tuple[float, float]]] = {}
    for time, metric, value in rows:
        out.setdefault(metric, []).append(
            (round((float(time) - T0.timestamp()) / HOUR, 6), round(float(value), 6))
        )
    return out


def test_every_panel_and_variable_reads_the_store_data_source(dashboard: dict[str, Any]) -> None:
    for item in dashboard["panels"]:
        assert item["datasource"] == DATASOURCE, item["title"]
        assert [t["datasource"] for t in item["targets"]] == [DATASOURCE], item["title"]
        assert all(t["rawQuery"] and t["editorMode"] == "code" for t in item["targets"])
    queries = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in queries} == {"node", "workload"}
    assert all(v["datasource"] == DATASOURCE for v in queries)


def test_the_variables_list_the_nodes_and_training_workloads(
    history: str, dashboard: dict[str, Any]
) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert run(history, grafana_sql(variables["node"]["query"], {}, "1h")) == [
        ("node-a",),
        ("node-b",),
    ]
    assert run(history, grafana_sql(variables["workload"]["query"], {}, "1h")) == [("ml/llama",)]


def test_gpu_hours_by_job_type_over_time(history: str, dashboard: dict[str, Any]) -> None:
    got = series(query(history, dashboard, "GPU-hours by job type"))
    assert got == {
        "idle": [(0.0, 1.0), (1.0, 1.0), (2.0, 2.0)],  # the notebook's GPU; GPU 0 from 2 h
        "inference": [(0.0, 1.0), (1.0, 1.0), (2.0, 1.0)],
        "training": [(0.0, 1.0), (1.0, 1.0)],
    }
    two_hourly = series(query(history, dashboard, "GPU-hours by job type", interval="2h"))
    assert two_hourly["idle"] == [(0.0, 2.0), (2.0, 2.0)]
    only_b = series(query(history, dashboard, "GPU-hours by job type", nodes=["node-b"]))
    assert set(only_b) == {"inference"}


def test_idle_gpu_hours_by_namespace_and_by_workload(
    history: str, dashboard: dict[str, Any]
) -> None:
    by_namespace = query(history, dashboard, "Idle GPU-hours by namespace")
    assert [(name, round(hours, 6)) for name, hours in by_namespace] == [
        ("lab", 3.0),  # the notebook's GPU, idle all along
        ("serve", 1.5),  # half of 3 hours
        ("(no pod)", 1.0),  # GPU 0 after its job
        ("ml", 0.2),  # a tenth of the 2 training hours
    ]
    by_workload = query(history, dashboard, "Idle GPU-hours by workload")
    assert [(name, round(hours, 6)) for name, hours in by_workload] == [
        ("lab/StatefulSet/notebook", 3.0),
        ("serve/Deployment/web", 1.5),
        ("(no workload)", 1.0),
        ("ml/PyTorchJob/llama", 0.2),
    ]


def test_pods_that_held_gpus_they_did_not_use(history: str, dashboard: dict[str, Any]) -> None:
    rows = query(history, dashboard, "Pods that held GPUs they did not use")
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], round(r[6], 6), r[7]) for r in rows] == [
        ("lab", "notebook-0", "node-a", "StatefulSet", "notebook", 1, 3.0, 0.0)
    ]
    assert (rows[0][9], rows[0][10]) == (T0, T0 + timedelta(hours=2))  # first and last hour
    busy = query(history, dashboard, "Pods that held GPUs they did not use", idle_below="85")
    assert [row[1] for row in busy] == ["notebook-0", "web-0"]  # web-0 peaks at 80 %


def test_training_periods_of_a_chosen_workload(history: str, dashboard: dict[str, Any]) -> None:
    title = "Training period of $workload"
    hourly = series(query(history, dashboard, title, workload="ml/llama"))
    assert hourly == {"train-0": [(0.0, 12.0), (1.0, 15.0)]}
    # Over two hours, each period weighted by the time it was seen.
    assert series(query(history, dashboard, title, workload="ml/llama", interval="2h")) == {
        "train-0": [(0.0, 13.5)]
    }
    assert query(history, dashboard, title, workload="lab/notebook") == []
