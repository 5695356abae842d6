"""A hostile Prometheus: a huge answer, a byte drip, 429/503 with Retry-After.

Test double: ``HostilePrometheus`` (tests/support/hostile_prometheus.py, raw sockets on
127.0.0.1, every answer bounded in time). The source must give up on each with one
``SourceError`` line, the daemon must stay under the DaemonSet's memory limit, keep an honest
/healthz and log one line per failure, and wait what Retry-After asks within its back-off.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from profiler_app.commands import options
from profiler_app.core.backoff import MAX_BACKOFF_INTERVALS
from profiler_app.core.errors import SourceError, UserError
from profiler_app.daemon import Daemon
from profiler_app.daemon.parts import Part
from profiler_app.sinks.metrics import Heartbeat, MetricsSink
from profiler_app.sources.prometheus import PrometheusSource
from profiler_app.sources.prometheus.client import retry_after_seconds
from tests.support.clock import FakeClock
from tests.support.hostile_prometheus import Behaviour, HostilePrometheus

NODE = "gpu-node-1"
DAEMONSET_MEMORY_LIMIT = 512 * 2**20  # infra/profiler.py's limit for the profiler container


def source(url: str, **limits: Any) -> PrometheusSource:
    return PrometheusSource(url, NODE, timeout=10.0, **limits)


def test_a_huge_answer_is_cut_at_the_cap() -> None:
    with HostilePrometheus(Behaviour("huge", total_bytes=64 * 2**20)) as server:
        prometheus = source(server.url, max_bytes=2**20)
        with pytest.raises(
            SourceError, match=r"more than 1,048,576 bytes \(--prometheus-max-bytes\)"
        ):
            prometheus.read(3600)
        prometheus.close()
    assert server.bytes_sent < 16 * 2**20  # the client hung up long before the end


def test_an_answer_under_the_cap_is_read() -> None:
    with HostilePrometheus(Behaviour("huge", total_bytes=200_000)) as server:
        prometheus = source(server.url, max_bytes=2**20)
        labels, values, _ = prometheus.range_query('up{job="x"}', 3600)
        prometheus.close()
    assert labels == [{"Hostname": NODE, "gpu": "0", "UUID": "GPU-0"}]
    assert values.shape[0] == 1


@pytest.mark.parametrize("kind", ["drip-body", "drip-status"])
def test_a_byte_drip_ends_at_the_deadline(kind: str) -> None:
    """One byte every 0.5 s passes every per-read timeout; the deadline still ends it."""
    with HostilePrometheus(Behaviour(kind, drip_period=0.5)) as server:
        prometheus = source(server.url, deadline_seconds=1.5)
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"within 1.5s \(the whole-request deadline"):
            prometheus.read(3600)
        took = time.monotonic() - started
        prometheus.close()
    assert 1.4 < took < 6.0  # the deadline plus a loaded machine's slack, not the drip's 14 h


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_carried_to_the_back_off(status: int) -> None:
    with HostilePrometheus(Behaviour("retry-after", status=status, retry_after="7")) as server:
        prometheus = source(server.url)
        with pytest.raises(SourceError) as caught:
            prometheus.read(3600)
        prometheus.close()
    assert caught.value.retry_after == 7.0
    assert f"answered HTTP {status}: too many queries; it asks to retry in 7s" in str(caught.value)

    clock = FakeClock()
    metrics = MetricsSink(Heartbeat(60.0, clock), clock=clock)
    part = Part("source", metrics, interval_seconds=1.0, clock=clock)
    part.failed(caught.value, since=clock())
    assert part.backoff.remaining() == 7.0  # not the 1 s the first back-off would be
    part.failed(SourceError("again", retry_after=10_000.0), since=clock())
    assert part.backoff.remaining() == MAX_BACKOFF_INTERVALS * 1.0  # capped, not hours


def test_retry_after_as_an_http_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds(later, now=now.timestamp()) == 30.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None


def test_the_daemon_through_a_drip_keeps_an_honest_healthz(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cycle ends at the deadline, /healthz stays 200 and says the source fails, and the
    failure is one log line."""
    caplog.set_level(logging.INFO)
    with HostilePrometheus(Behaviour("drip-body", drip_period=0.5)) as server:
        metrics = MetricsSink(Heartbeat(60.0))
        daemon = Daemon(
            node=NODE,
            source=source(server.url, deadline_seconds=1.5),
            sinks=[metrics],
            metrics=metrics,
            window_seconds=3600,
            interval_seconds=30,
        )
        started = time.monotonic()
        assert daemon.run_cycle() is False
        assert time.monotonic() - started < 6.0
        statuses: list[str] = []
        body = b"".join(
            metrics.app()({"PATH_INFO": "/healthz"}, lambda status, _h: statuses.append(status))
        ).decode()
        daemon.close()
    assert statuses == ["200 OK"]
    assert "failing: source (1 in a row)" in body
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "whole-request deadline" in warnings[0]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("16Mi", 16 * 2**20),
        ("1048576", 2**20),
        ("2Gi", 2 * 2**30),
    ],
)
def test_sizes(value: str, expected: int) -> None:
    assert options.byte_size(value, "--prometheus-max-bytes") == expected


@pytest.mark.parametrize("value", ["0", "-1", "16MB", "lots", ""])
def test_bad_sizes_name_the_flag(value: str) -> None:
    with pytest.raises(UserError, match=r"^--prometheus-max-bytes: invalid size"):
        options.byte_size(value, "--prometheus-max-bytes")


# Runs ``gpu-profiler analyze`` and reports the process's own peak RSS (KiB) on its last stderr
# line: VmHWM of its own address space. (getrusage's ru_maxrss survives execve on Linux, so a
# child of a large pytest process would report the parent's size.)
MEASURED = (
    "import re, sys\n"
    "from profiler_app.cli import main\n"
    "try:\n"
    "    status = main(sys.argv[1:])\n"
    "finally:\n"
    "    status_text = open('/proc/self/status').read()\n"
    "    print(re.search(r'VmHWM:\\s+(\\d+)', status_text).group(1), file=sys.stderr)\n"
    "sys.exit(status)\n"
)


def test_analyze_against_a_256_mib_answer_stays_under_the_memory_limit() -> None:
    """``gpu-profiler analyze`` in a child process against a 256 MiB answer: one error line,
    exit 2, and a peak RSS far under the DaemonSet's limit (without the cap it reads all)."""
    with HostilePrometheus(Behaviour("huge")) as server:
        command = [sys.executable, "-c", MEASURED, "analyze", "--node", NODE]
        completed = subprocess.run(
            [*command, "--prometheus-url", server.url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "GPU_PROFILER_PROMETHEUS_MAX_BYTES": ""},
        )
    *lines, peak_kib = completed.stderr.strip().splitlines()
    assert completed.returncode == 2, completed.stderr
    assert len(lines) == 1
    assert "more than 16,777,216 bytes (--prometheus-max-bytes)" in lines[0]
    assert int(peak_kib) * 1024 < DAEMONSET_MEMORY_LIMIT / 2, (
        f"peak RSS {int(peak_kib) // 1024} MiB"
    )
