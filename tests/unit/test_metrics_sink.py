"""The /metrics page and /healthz, served over HTTP on 127.0.0.1 and parsed back."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from profiler_app.core.errors import UserError
from profiler_app.sinks.metrics import BASES, JOB_TYPES, Heartbeat, MetricsSink
from tests.support.cycles import mig_profile, sample_cycle

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def served(clock: Clock) -> Iterator[tuple[MetricsSink, str]]:
    sink = MetricsSink(Heartbeat(stale_after_seconds=90, clock=clock))
    port = sink.serve("127.0.0.1", 0)
    yield sink, f"http://127.0.0.1:{port}"
    sink.close()


def scrape(base: str) -> Samples:
    response = requests.get(f"{base}/metrics", timeout=5)
    response.raise_for_status()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def gpu_labels(gpu: str, **extra: str) -> frozenset[tuple[str, str]]:
    namespace, pod = ("ml", "trainer-0") if gpu == "0" else ("", "")
    labels = {
        "Hostname": "node-a",
        "gpu": gpu,
        "UUID": f"GPU-{gpu}-0000",
        "GPU_I_ID": "",
        "GPU_I_PROFILE": "",
        "namespace": namespace,
        "pod": pod,
    }
    return frozenset({**labels, **extra}.items())


def test_gpu_metrics_of_the_latest_cycle(served: tuple[MetricsSink, str]) -> None:
    sink, base = served
    sink.publish(sample_cycle())
    samples = scrape(base)
    for job_type in ("idle", "training", "inference", "bursty"):
        expected = 1.0 if job_type == "training" else 0.0
        assert samples["gpu_profiler_gpu_job_type", gpu_labels("0", job_type=job_type)] == expected
    assert samples["gpu_profiler_gpu_job_type", gpu_labels("1", job_type="idle")] == 1.0
    assert samples["gpu_profiler_gpu_period_seconds", gpu_labels("0")] == 12.5
    assert ("gpu_profiler_gpu_period_seconds", gpu_labels("1")) not in samples
    assert samples["gpu_profiler_gpu_utilization_max_percent", gpu_labels("0")] == 90.0
    assert samples["gpu_profiler_gpu_utilization_p95_percent", gpu_labels("0")] == 85.0
    assert samples["gpu_profiler_gpu_idle_seconds", gpu_labels("0")] == pytest.approx(180.0)
    assert samples["gpu_profiler_gpu_idle_seconds", gpu_labels("1")] == 1800.0
    assert samples["gpu_profiler_gpu_confidence", gpu_labels("0")] == 0.9
    assert samples["gpu_profiler_gpu_confidence", gpu_labels("1")] == 0.95
    bases = {
        dict(labels)["basis"]: value
        for (name, labels), value in samples.items()
        if name == "gpu_profiler_gpu_basis" and ("gpu", "0") in labels
    }
    assert bases == dict.fromkeys(BASES, 0.0) | {"util-loop": 1.0}
    assert len(BASES) == 9  # a bounded label: never the free-text reasons
    engine = gpu_labels("0", engine="torchrun", framework="pytorch")
    assert samples["gpu_profiler_gpu_engine_info", engine] == 1.0
    # Nothing known of GPU 1: no info series rather than one with empty labels.
    assert not [
        key
        for key in samples
        if key[0] == "gpu_profiler_gpu_engine_info" and ("gpu", "1") in key[1]
    ]


def test_series_of_a_vanished_gpu_are_removed(served: tuple[MetricsSink, str]) -> None:
    sink, base = served
    cycle = sample_cycle()
    sink.publish(cycle)
    assert ("gpu_profiler_gpu_utilization_max_percent", gpu_labels("1")) in scrape(base)
    sink.publish(replace(cycle, gpus=cycle.gpus[:1]))
    samples = scrape(base)
    assert not [key for key in samples if ("gpu", "1") in key[1]]
    assert ("gpu_profiler_gpu_utilization_max_percent", gpu_labels("0")) in samples


def test_health_metrics(served: tuple[MetricsSink, str]) -> None:
    sink, base = served
    assert scrape(base)["gpu_profiler_errors_total", frozenset({("kind", "store")})] == 0.0
    sink.record_error("store")
    sink.record_error("store")
    sink.record_cycle(0.2, success=False)
    sink.record_cycle(0.3, success=True)
    samples = scrape(base)
    assert samples["gpu_profiler_errors_total", frozenset({("kind", "store")})] == 2.0
    assert samples["gpu_profiler_errors_total", frozenset({("kind", "source")})] == 0.0
    assert samples["gpu_profiler_cycle_duration_seconds_count", frozenset()] == 2.0
    assert samples["gpu_profiler_cycle_duration_seconds_sum", frozenset()] == pytest.approx(0.5)
    assert samples["gpu_profiler_last_success_timestamp_seconds", frozenset()] > 1.7e9


def test_nothing_but_our_metrics_on_the_page(served: tuple[MetricsSink, str]) -> None:
    _, base = served
    names = {name for name, _ in scrape(base)}
    assert names
    assert all(name.startswith("gpu_profiler_") for name in names), names


def test_healthz_follows_the_heartbeat(served: tuple[MetricsSink, str], clock: Clock) -> None:
    sink, base = served
    response = requests.get(f"{base}/healthz", timeout=5)
    assert response.status_code == 200
    assert response.text.startswith("ok")
    clock.now += 91
    response = requests.get(f"{base}/healthz", timeout=5)
    assert response.status_code == 503
    assert "91s ago" in response.text
    sink.heartbeat.beat()
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    assert requests.get(f"{base}/other", timeout=5).status_code == 404


def test_healthz_says_what_fails_while_the_loop_lives(clock: Clock) -> None:
    """An outage is not a reason to restart the daemon (200), but /healthz names it, and the
    consecutive-failures gauge shows it to Prometheus."""
    sink = MetricsSink(Heartbeat(stale_after_seconds=90, clock=clock), clock=clock)
    port = sink.serve("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        assert "no success yet; all parts work" in requests.get(f"{base}/healthz", timeout=5).text
        sink.record_cycle(0.1, success=True)
        clock.now += 400
        sink.heartbeat.beat()
        sink.record_failures("kubernetes", 4)
        response = requests.get(f"{base}/healthz", timeout=5)
        assert response.status_code == 200
        assert response.text == (
            "ok: last cycle 0s ago; last success 400s ago; failing: kubernetes (4 in a row)\n"
        )
        failing = frozenset({("kind", "kubernetes")})
        assert scrape(base)["gpu_profiler_consecutive_failures", failing] == 4
        sink.record_failures("kubernetes", 0)
        assert scrape(base)["gpu_profiler_consecutive_failures", failing] == 0
        assert "all parts work" in requests.get(f"{base}/healthz", timeout=5).text
    finally:
        sink.close()


def test_busy_port_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sink = MetricsSink(Heartbeat(60))
        with pytest.raises(UserError, match=rf"cannot serve metrics on 127.0.0.1:{port}: "):
            sink.serve("127.0.0.1", port)


def test_close_stops_the_server(clock: Clock) -> None:
    sink = MetricsSink(Heartbeat(60, clock=clock))
    port = sink.serve("127.0.0.1", 0)
    sink.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_mig_instances_are_series_of_their_own(served: tuple[MetricsSink, str]) -> None:
    """Seven instances of one GPU: seven series, labelled as dcgm-exporter labels them, with
    the instance's GR_ENGINE_ACTIVE in percent as its utilisation."""
    sink, base = served
    instances = [mig_profile("0", str(gi), "inference", util=gi / 10) for gi in range(1, 8)]
    sink.publish(replace(sample_cycle(), gpus=instances))
    scraped = scrape(base)
    for gi in range(1, 8):
        labels = dict(gpu_labels("0", GPU_I_ID=str(gi), GPU_I_PROFILE="1g.10gb"))
        labels |= {"namespace": "", "pod": ""}
        key = ("gpu_profiler_gpu_utilization_max_percent", frozenset(labels.items()))
        assert scraped[key] == pytest.approx(gi * 10)
    job_types = [key for key in scraped if key[0] == "gpu_profiler_gpu_job_type"]
    assert len(job_types) == 7 * len(JOB_TYPES)


def test_idle_connections_cannot_pile_up_threads(
    served: tuple[MetricsSink, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that connect and send nothing hold at most MAX_CONCURRENT_REQUESTS threads; the
    rest are closed at once, and a scrape is served again once the idle ones time out."""
    from profiler_app.sinks import metrics as metrics_module  # noqa: PLC0415

    monkeypatch.setattr(metrics_module._QuietHandler, "timeout", 1.0)
    _, base = served
    port = int(base.rsplit(":", 1)[1])
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    try:
        time.sleep(0.5)
        assert threading.active_count() - before <= metrics_module.MAX_CONCURRENT_REQUESTS
        closed = 0
        for connection in idle:
            connection.settimeout(3.0)
            with contextlib.suppress(TimeoutError):  # one of the served few, waiting
                closed += connection.recv(1) == b""
        assert closed >= 40 - metrics_module.MAX_CONCURRENT_REQUESTS
        time.sleep(1.5)  # the served idle ones reach the handler's timeout
        assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    finally:
        for connection in idle:
            connection.close()
