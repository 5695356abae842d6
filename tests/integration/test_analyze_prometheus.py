"""``gpu-profiler analyze`` against a real Prometheus holding the standard dataset.

The ``prometheus`` fixture (tests/conftest.py) backfills 3 nodes x 4 GPUs of dcgm-exporter
series with known job types; request counts come from Prometheus' own
``prometheus_http_requests_total``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from profiler_app.cli import main
from profiler_app.core.errors import SourceError
from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, POWER_USAGE, SM_ACTIVE
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.dcgm import Gpu, OpenMetricsBuilder, sample_times, standard_dataset
from tests.support.prometheus import LoadedPrometheus, PrometheusServer

pytestmark = pytest.mark.integration
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname"}


def analyze_json(
    capsys: pytest.CaptureFixture[str], prometheus: LoadedPrometheus, *arguments: str
) -> list[dict[str, object]]:
    status = main(["analyze", "--prometheus-url", prometheus.url, "--output", "json", *arguments])
    captured = capsys.readouterr()
    assert (status, captured.err) == (0, "")
    records: list[dict[str, object]] = json.loads(captured.out)["gpus"]
    return records


def assert_as_expected(records: list[dict[str, object]], prometheus: LoadedPrometheus) -> None:
    for record in records:
        job_type, period = prometheus.expected[(str(record["hostname"]), str(record["gpu"]))]
        assert record["job_type"] == job_type, record["labels"]
        if period is None:
            assert record["period_seconds"] is None
        else:
            assert isinstance(record["period_seconds"], float)
            assert math.isclose(record["period_seconds"], period, rel_tol=0.1)


@pytest.mark.parametrize("node", ["gpu-node-1", "gpu-node-2", "gpu-node-3"])
def test_every_gpu_gets_its_job_type_and_all_labels(
    capsys: pytest.CaptureFixture[str], prometheus: LoadedPrometheus, node: str
) -> None:
    records = analyze_json(capsys, prometheus, "--node", node)
    assert [record["gpu"] for record in records] == ["0", "1", "2", "3"]
    assert_as_expected(records, prometheus)
    for record in records:
        labels = record["labels"]
        assert isinstance(labels, dict)
        assert labels.keys() >= DCGM_LABELS
        assert labels["Hostname"] == node
        busy = record["job_type"] != "idle"
        assert ("pod" in labels) is busy
        assert record["pod"] == labels.get("pod")
        # The dataset has SM_ACTIVE (a default field) but no GR_ENGINE_ACTIVE or DRAM_ACTIVE.
        expected = {GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE, SM_ACTIVE}
        assert set(record["stats"]) == expected  # type: ignore[arg-type]
        assert record["reasons"]


def test_one_request_per_field(
    capsys: pytest.CaptureFixture[str], prometheus: LoadedPrometheus
) -> None:
    before = prometheus.server.requests_served()
    fields = [GPU_UTIL, MEM_COPY_UTIL, FB_USED, SM_ACTIVE]
    arguments = [argument for field in fields for argument in ("--field", field)]
    records = analyze_json(capsys, prometheus, "--node", "gpu-node-2", *arguments)
    assert prometheus.server.requests_served() - before == len(fields)
    for record in records:
        assert list(record["stats"]) == fields  # type: ignore[call-overload]
    by_gpu = {record["gpu"]: record["stats"] for record in records}
    assert 0 < by_gpu["3"][SM_ACTIVE]["max"] <= 1  # type: ignore[index]
    assert by_gpu["3"][FB_USED]["max"] > 60_000  # type: ignore[index]


def test_the_source_counts_its_requests_and_bytes(prometheus: LoadedPrometheus) -> None:
    source = PrometheusSource(prometheus.url, "gpu-node-1", fields=[GPU_UTIL, FB_USED])
    before = prometheus.server.requests_served()
    source.read(1800)
    source.read(1800)
    assert source.stats.requests == 4 == prometheus.server.requests_served() - before
    assert source.stats.bytes_read > 10_000
    source.close()


def test_a_window_beyond_11000_points_is_split(
    capsys: pytest.CaptureFixture[str], prometheus: LoadedPrometheus
) -> None:
    """4 h at 1 s is 14,401 points: Prometheus refuses it in one request; analyze splits it."""
    end = prometheus.dataset.end
    refused = requests.get(
        f"{prometheus.url}/api/v1/query_range",
        params={"query": GPU_UTIL, "start": end - 4 * 3600, "end": end, "step": 1},
        timeout=10,
    )
    assert refused.status_code == 400
    assert "11,000 points" in refused.json()["error"]
    before = prometheus.server.requests_served()
    records = analyze_json(
        capsys,
        prometheus,
        "--node",
        "gpu-node-3",
        "--window",
        "4h",
        "--step",
        "1s",
        "--field",
        GPU_UTIL,
    )
    assert prometheus.server.requests_served() - before == 2
    assert_as_expected(records, prometheus)


def test_several_nodes_share_nothing(
    capsys: pytest.CaptureFixture[str], prometheus: LoadedPrometheus
) -> None:
    first = analyze_json(capsys, prometheus, "--node", "gpu-node-1", "--field", GPU_UTIL)
    second = analyze_json(capsys, prometheus, "--node", "gpu-node-2", "--field", GPU_UTIL)
    assert {r["uuid"] for r in first}.isdisjoint({r["uuid"] for r in second})


def test_unknown_node(capsys: pytest.CaptureFixture[str], prometheus: LoadedPrometheus) -> None:
    status = main(["analyze", "--prometheus-url", prometheus.url, "--node", "gpu-node-9"])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err == (
        "gpu-profiler: error: no series for Hostname=gpu-node-9 in the last 30m: "
        "unknown node or no dcgm-exporter data in the window\n"
    )


def test_console_script_prints_the_table(prometheus: LoadedPrometheus) -> None:
    script = Path(sys.executable).with_name("gpu-profiler")
    completed = subprocess.run(
        [str(script), "analyze", "--prometheus-url", prometheus.url, "--node", "gpu-node-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (completed.returncode, completed.stderr) == (0, "")
    header, *rows = completed.stdout.splitlines()
    assert header.startswith("NODE")
    job_type = header.index("JOB TYPE")  # columns are aligned; empty ones are left out
    found = {(row.split()[0], row.split()[1]): row[job_type:].split()[0] for row in rows}
    expected = {key: job for key, (job, _) in prometheus.expected.items() if key[0] == "gpu-node-1"}
    assert found == expected


def test_an_exporter_without_memory_copy_utilisation_is_one_warning_not_a_failure(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Only utilisation and framebuffer exported (no DCGM_FI_DEV_MEM_COPY_UTIL, no power):
    the default fields still work, each missing one said once on stderr."""
    dataset = standard_dataset(nodes=1, gpus_per_node=4, hours=1, fields=[GPU_UTIL, FB_USED])
    with PrometheusServer(dataset.openmetrics) as server:
        status = main(
            ["analyze", "--prometheus-url", server.url, "--node", "gpu-node-1", "--output", "json"]
        )
    captured = capsys.readouterr()
    assert status == 0
    warnings = [record.message for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 2
    assert f"no {MEM_COPY_UTIL} series for Hostname=gpu-node-1" in warnings[0]
    assert f"no {POWER_USAGE} series" in warnings[1]
    records = json.loads(captured.out)["gpus"]
    assert [set(record["stats"]) for record in records] == [{GPU_UTIL, FB_USED}] * 4


def test_a_restarted_server_keeps_port_and_data() -> None:
    """The support server others' reliability tests rely on: down is transient, then back."""
    dataset = standard_dataset(nodes=1, gpus_per_node=2, hours=1, fields=[GPU_UTIL])
    with PrometheusServer(dataset.openmetrics) as server:
        source = PrometheusSource(server.url, "gpu-node-1")
        (before,) = source.read(1800, end=dataset.end)
        server.stop()
        with pytest.raises(SourceError, match="Connection refused"):
            source.read(1800, end=dataset.end)
        server.start()
        (after,) = source.read(1800, end=dataset.end)
    np.testing.assert_array_equal(before.values, after.values)
    assert before.values.shape == (2, 181)
    assert not np.isnan(before.values).any()


def test_openmetrics_builder_round_trips_through_promtool_and_prometheus() -> None:
    times = sample_times(30, 10.0, end=time.time() // 10 * 10)  # on the query grid
    values = np.arange(30, dtype=np.float64)
    values[5:8] = np.nan  # missed scrapes: left out of the text
    builder = OpenMetricsBuilder()
    odd = {"Hostname": 'we"ird\\host', "gpu": "0"}
    builder.add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", odd, values * 1000, times, kind="counter")
    builder.add(GPU_UTIL, Gpu("gpu-node-1", 0, namespace="ml", pod="p").labels(), values, times)
    text = builder.text()
    assert text.endswith("# EOF\n")
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in text
    with PrometheusServer(text) as server:
        source = PrometheusSource(
            server.url, 'we"ird\\host', fields=["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"]
        )
        (energy,) = source.read(290, end=float(times[-1]))
        (util,) = PrometheusSource(server.url, "gpu-node-1", step_seconds=10).read(
            290, end=float(times[-1])
        )
    assert energy.labels == [odd]
    np.testing.assert_array_equal(energy.values[0][[0, 4, 8, 29]], [0, 4000, 8000, 29000])
    assert util.labels[0]["pod"] == "p"
    assert util.labels[0]["UUID"].startswith("GPU-")
    # Within the 5-minute lookback a gap shows the last sample before it.
    np.testing.assert_array_equal(util.values[0][4:9], [4, 4, 4, 4, 8])
