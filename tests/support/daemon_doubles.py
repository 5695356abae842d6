"""Test doubles for the profiling loop's tests: ``ScriptedSource`` for a metrics source and
``RecordingSink`` for a sink. The source returns dcgm-shaped matrices built from the shared signal
generators (or raises what the test scripts), the sink records what it receives (or raises); a
``Daemon`` made by ``make_daemon`` has them, a host that reports fixed figures and its metrics
sink. Where back-off timing matters, time is a ``FakeClock`` advanced one interval per cycle.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np

from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    CycleResult,
    PodIoSeries,
    PodPeak,
    SeriesMatrix,
)
from profiler_app.daemon import Daemon
from profiler_app.sinks.metrics import Heartbeat, MetricsSink
from profiler_app.sources.kube_pods import PodInfo
from tests.support import signals
from tests.support.clock import FakeClock

STEP = 10.0
POINTS = 180  # 30 minutes at 10 s
POD_UID = "0b6a4e0c-5d2f-4c6e-9a3e-2f1b7c8d9e01"


def node_matrices() -> list[SeriesMatrix]:
    """GPU 0 trains with a 120 s period (from a local process of pod ``POD_UID``); GPU 1 idles."""
    rng = np.random.default_rng(7)
    util = np.vstack(
        [signals.square(POINTS, 12, rng, duty=0.6), signals.near_zero_noise(POINTS, rng)]
    )
    timestamps = 1_700_000_000.0 + STEP * np.arange(POINTS)
    labels = [
        {"gpu": "0", "UUID": "GPU-0", "Hostname": "node-a", "pod_uid": POD_UID},
        {"gpu": "1", "UUID": "GPU-1", "Hostname": "node-a"},
    ]
    fb = np.vstack([np.full(POINTS, 61_000.0), np.zeros(POINTS)])
    return [
        SeriesMatrix(GPU_UTIL, labels, timestamps, util, STEP),
        SeriesMatrix(FB_USED, [dict(x) for x in labels], timestamps, fb, STEP),
    ]


class ScriptedSource:
    def __init__(self, script: list[Exception | None] | None = None) -> None:
        self.script = script or []
        self.reads = 0
        self.block: threading.Event | None = None

    def read(self, window_seconds: float) -> list[SeriesMatrix]:
        self.reads += 1
        if self.block is not None:
            self.block.wait(30)
        outcome = self.script.pop(0) if self.script else None
        if outcome is not None:
            raise outcome
        return node_matrices()


class RecordingSink:
    def __init__(
        self,
        name: str,
        failures: int = 0,
        error: Exception | None = None,
        log: list[str] | None = None,
    ) -> None:
        self.name = name
        self.failures = failures
        self.error = error or ConnectionError(f"{name} is down")
        self.received: list[CycleResult] = []
        self.attempts = 0
        self.closed = False
        self.log = log if log is not None else []

    def publish(self, result: CycleResult) -> None:
        self.attempts += 1
        if self.failures:
            self.failures -= 1
            raise self.error
        self.received.append(result)

    def close(self) -> None:
        self.closed = True
        self.log.append(f"close {self.name}")


class StaticHost:
    def snapshot(self) -> dict[str, float]:
        return {"cpu_percent": 5.0}

    def pod_peaks(self) -> dict[str, PodPeak]:
        return {POD_UID: PodPeak(cpu_util_max=150.0, mem_used_max_bytes=2e9)}

    def pod_io(self) -> dict[str, PodIoSeries]:
        return {}


def pod_info() -> PodInfo:
    return PodInfo(
        uid=POD_UID,
        namespace="ml",
        name="trainer-0",
        node="node-a",
        phase="Running",
        start_time=datetime(2026, 11, 22, 3, 0, tzinfo=UTC),
        gpu_requests=1,
        gpu_limits=1,
        container_ids={},
    )


def errors(metrics: MetricsSink, kind: str) -> float:
    value = metrics.registry.get_sample_value("gpu_profiler_errors_total", {"kind": kind})
    assert value is not None
    return value


def failures(metrics: MetricsSink, kind: str) -> float:
    value = metrics.registry.get_sample_value("gpu_profiler_consecutive_failures", {"kind": kind})
    assert value is not None
    return value


def make_daemon(
    source: ScriptedSource,
    *sinks: RecordingSink,
    interval: float = 30.0,
    pods: Callable[[], list[PodInfo]] | None = None,
    stale_after: float = 90.0,
    clock: FakeClock | None = None,
    sources: contextlib.ExitStack | None = None,
) -> tuple[Daemon, MetricsSink]:
    if clock is None:
        metrics = MetricsSink(Heartbeat(stale_after_seconds=stale_after))
    else:
        metrics = MetricsSink(Heartbeat(stale_after, clock=clock), clock=clock)
    daemon = Daemon(
        node="node-a",
        source=source,
        sinks=[*sinks, metrics],
        metrics=metrics,
        window_seconds=POINTS * STEP,
        interval_seconds=interval,
        host=StaticHost(),
        pods=pods,
        sources=sources,
        **({} if clock is None else {"clock": clock}),
    )
    return daemon, metrics


def cycles_every_interval(daemon: Daemon, clock: FakeClock, count: int) -> list[bool]:
    """``count`` cycles, one interval apart on the fake clock, as the loop runs them."""
    outcomes = []
    for _ in range(count):
        outcomes.append(daemon.run_cycle())
        clock.advance(daemon.interval_seconds)
    return outcomes
