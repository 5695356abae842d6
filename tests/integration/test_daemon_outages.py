"""The daemon through outages, judged by the GpuProfilerFailing alert on its own /metrics.

Real parts: Prometheus (Debian package) as the daemon's source, stopped and started for its
outage; the Kubernetes client and the annotation sink; the daemon's metrics HTTP server, scraped
after every cycle; promtool, which evaluates the GpuProfilerFailing rule from
infra/monitoring/rules.yaml on the scraped values (given as the series Prometheus would have
scraped, one sample per interval).

Test doubles: the stand-in Kubernetes API server (tests/support/apiserver/) answers 429 with
Retry-After or 503 on demand; a ``FakeClock`` drives the daemon, its back-off, the sink's
heartbeat and the timestamps on /metrics, so 25 simulated minutes take seconds. Cycles run one
interval apart on that clock, as the loop runs them. The sink's heartbeat is one interval, so
every cycle talks to the API (with the default 10 minutes an unchanged node costs no request,
and an outage shows only once there is something to write).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from profiler_app.core.kube import connect
from profiler_app.daemon import Daemon
from profiler_app.sinks.kubernetes import KubernetesSink
from profiler_app.sinks.metrics import Heartbeat, MetricsSink
from profiler_app.sources.prometheus import PrometheusSource
from tests.infra.promtool_cases import alert_rules, expand
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.clock import FakeClock
from tests.support.dcgm import standard_dataset
from tests.support.prometheus import PrometheusServer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed"),
]

NODE = "gpu-node-1"
NODE_PATH = f"/api/v1/nodes/{NODE}"
INTERVAL = 30.0
RULES = Path(__file__).resolve().parents[2] / "infra" / "monitoring" / "rules.yaml"
ALERT = "GpuProfilerFailing"
INSTANCE = {"job": "gpu-profiler", "instance": "10.0.1.5:9401"}


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with PrometheusServer(
        standard_dataset(nodes=1, gpus_per_node=2, hours=1).openmetrics
    ) as server:
        yield server


@dataclass
class Timeline:
    """What /metrics and /healthz said after each cycle (cycle i ran at i * INTERVAL)."""

    last_success: list[float] = field(default_factory=list)
    failures: list[dict[str, float]] = field(default_factory=list)
    errors: list[dict[str, float]] = field(default_factory=list)
    healthz: list[str] = field(default_factory=list)

    def at(self, seconds: float) -> int:
        return round(seconds / INTERVAL)


class Harness:
    def __init__(self, prometheus: PrometheusServer, apiserver: StandInApiServer, tmp: Path):
        self.clock = FakeClock(start=0.0)  # promtool's series start at time 0
        self.metrics = MetricsSink(Heartbeat(3 * INTERVAL, clock=self.clock), clock=self.clock)
        self.base = f"http://127.0.0.1:{self.metrics.serve('127.0.0.1', 0)}"
        connection = connect(
            str(apiserver.write_kubeconfig(tmp / "kubeconfig")), request_timeout=(1, 2)
        )
        assert connection is not None
        self.connection = connection
        self.source = PrometheusSource(
            prometheus.url, NODE, "Hostname", ["DCGM_FI_DEV_GPU_UTIL"], 10.0, timeout=2.0
        )
        sink = KubernetesSink(connection, NODE, heartbeat_seconds=INTERVAL, clock=self.clock)
        self.daemon = Daemon(
            node=NODE,
            source=self.source,
            sinks=[sink, self.metrics],
            metrics=self.metrics,
            window_seconds=1800,
            interval_seconds=INTERVAL,
            clock=self.clock,
        )
        self.timeline = Timeline()

    def run(
        self, minutes: float, before_cycle: Callable[[float], None] = lambda t: None
    ) -> Timeline:
        for _ in range(round(minutes * 60 / INTERVAL)):
            before_cycle(self.clock())
            self.daemon.run_cycle()
            self._scrape()
            self.clock.advance(INTERVAL)
        return self.timeline

    def _scrape(self) -> None:
        text = requests.get(f"{self.base}/metrics", timeout=5).text
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        by_kind = {
            name: {s.labels["kind"]: s.value for s in samples if s.name == name}
            for name in ("gpu_profiler_consecutive_failures", "gpu_profiler_errors_total")
        }
        (last,) = [
            s.value for s in samples if s.name == "gpu_profiler_last_success_timestamp_seconds"
        ]
        self.timeline.last_success.append(last)
        self.timeline.failures.append(by_kind["gpu_profiler_consecutive_failures"])
        self.timeline.errors.append(by_kind["gpu_profiler_errors_total"])
        self.timeline.healthz.append(requests.get(f"{self.base}/healthz", timeout=5).text)

    def close(self) -> None:
        self.daemon.close()
        self.source.close()
        self.connection.close()


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE)
        yield server


@pytest.fixture
def harness(
    prometheus: PrometheusServer, apiserver: StandInApiServer, tmp_path: Path
) -> Iterator[Harness]:
    made = Harness(prometheus, apiserver, tmp_path)
    yield made
    made.close()


def promtool_alert_test(
    tmp: Path, timeline: Timeline, *, quiet_at: list[float], firing_at: list[float]
) -> subprocess.CompletedProcess[str]:
    """Runs ``promtool test rules`` on the scraped last_success values: GpuProfilerFailing must
    be quiet (or only pending) at ``quiet_at`` seconds and firing at ``firing_at``."""
    rule = alert_rules()[ALERT]
    firing = {
        "exp_labels": {**INSTANCE, **rule["labels"]},
        "exp_annotations": {
            key: expand(text, INSTANCE, None) for key, text in rule["annotations"].items()
        },
    }
    labels = ",".join(f'{key}="{value}"' for key, value in INSTANCE.items())
    values = " ".join(f"{value:g}" for value in timeline.last_success)
    document: dict[str, Any] = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": [
                    {
                        "series": f"gpu_profiler_last_success_timestamp_seconds{{{labels}}}",
                        "values": values,
                    }
                ],
                "alert_rule_test": [
                    *(
                        {"eval_time": f"{t:g}s", "alertname": ALERT, "exp_alerts": []}
                        for t in quiet_at
                    ),
                    *(
                        {"eval_time": f"{t:g}s", "alertname": ALERT, "exp_alerts": [firing]}
                        for t in firing_at
                    ),
                ],
            }
        ],
    }
    test_file = tmp / "outage.test.yaml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False))
    return subprocess.run(
        ["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, check=False
    )


def kubernetes_failing(timeline: Timeline, start: float, end: float) -> list[float]:
    return [f["kubernetes"] for f in timeline.failures[timeline.at(start) : timeline.at(end)]]


def test_429_storm_with_retry_after_fires_the_alert(
    harness: Harness, apiserver: StandInApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """25 minutes of 429 + Retry-After: 120 from t=60 s. Waiting out a Retry-After is not a
    success: last_success stays at 30 s, so the alert fires 15 + 5 minutes later."""

    def storm(now: float) -> None:
        if now == 60:
            for method in ("GET", "PATCH"):
                apiserver.fail(method, NODE_PATH, 429, retry_after=120)
        if now == 60 + 25 * 60:
            apiserver.clear_faults()

    caplog.set_level(logging.INFO, logger="profiler_app.daemon")
    timeline = harness.run(minutes=40, before_cycle=storm)

    assert timeline.last_success[timeline.at(30)] == 30
    assert set(timeline.last_success[timeline.at(60) : timeline.at(1560)]) == {30}
    # Tries at 60, 180, 300, 420 (Retry-After beats 30, 60, 120 s), then 660, 960, 1260
    # (240, 300, 300 s); none between: one error each.
    assert timeline.errors[timeline.at(1530)]["kubernetes"] == 7
    assert all(kubernetes_failing(timeline, 60, 1560))
    assert all(
        "failing: kubernetes" in text
        for text in timeline.healthz[timeline.at(60) : timeline.at(1560)]
    )
    assert caplog.text.count("kubernetes recovered") == 1
    recovered = timeline.at(1560)
    assert timeline.last_success[recovered] == 1560
    result = promtool_alert_test(
        tmp_path, timeline, quiet_at=[20 * 60, 21 * 60 - 30], firing_at=[22 * 60, 25 * 60]
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ten_minute_api_outage_shows_in_metrics_healthz_and_the_alert_expression(
    harness: Harness, apiserver: StandInApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """503 for 10 minutes from t=60 s: too short to page (the alert needs 20), but /metrics,
    /healthz and the log say so the whole time, and requests follow the back-off schedule."""

    def outage(now: float) -> None:
        if now == 60:
            for method in ("GET", "PATCH"):
                apiserver.fail(method, NODE_PATH, 503)
        if now == 660:
            apiserver.clear_faults()

    caplog.set_level(logging.INFO, logger="profiler_app.daemon")
    timeline = harness.run(minutes=20, before_cycle=outage)

    # Tries at 60, 90, 150, 270 and 510 s (waits of 1, 2, 4, 8 intervals); the next, at 810 s
    # (a 10-interval wait), finds the API back.
    assert timeline.errors[timeline.at(780)]["kubernetes"] == 5
    assert kubernetes_failing(timeline, 60, 810) == [1, 2, 2, 3, 3, 3, 3, *[4] * 8, *[5] * 10]
    assert timeline.failures[timeline.at(810)]["kubernetes"] == 0
    assert set(timeline.last_success[timeline.at(60) : timeline.at(810)]) == {30}
    assert "failing: kubernetes (5 in a row)" in timeline.healthz[timeline.at(780)]
    assert "last success 750s ago" in timeline.healthz[timeline.at(780)]
    assert caplog.text.count("kubernetes recovered after 5 failure(s)") == 1
    result = promtool_alert_test(tmp_path, timeline, quiet_at=[15 * 60, 19 * 60], firing_at=[])
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_outage_fires_the_alert_and_recovers(
    harness: Harness, prometheus: PrometheusServer, tmp_path: Path
) -> None:
    """Prometheus stopped for 25 minutes from t=60 s, then started again."""

    def outage(now: float) -> None:
        if now == 60:
            prometheus.stop()
        if now == 60 + 25 * 60:
            prometheus.start()

    try:
        timeline = harness.run(minutes=40, before_cycle=outage)
    finally:
        if not prometheus.running:
            prometheus.start()

    assert set(timeline.last_success[timeline.at(60) : timeline.at(1560)]) == {30}
    # Source tries at 60, 90, 150, 270, 510, 810, 1110, 1410 s; none between.
    assert timeline.errors[timeline.at(1530)]["source"] == 8
    source_failing = [f["source"] for f in timeline.failures[timeline.at(60) : timeline.at(1560)]]
    assert all(source_failing)
    assert "failing: source (8 in a row)" in timeline.healthz[timeline.at(1530)]
    # The next try after the outage, at 1710 s, succeeds: no success is invented before it.
    assert timeline.last_success[timeline.at(1680)] == 30
    assert timeline.last_success[timeline.at(1710)] == 1710
    result = promtool_alert_test(
        tmp_path,
        timeline,
        quiet_at=[20 * 60, 21 * 60 - 30, 1710 + 60],
        firing_at=[22 * 60, 28 * 60],
    )
    assert result.returncode == 0, result.stdout + result.stderr
