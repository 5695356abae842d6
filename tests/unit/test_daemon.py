"""The profiling loop: publishing, error isolation, back-off, recovery and ordered stopping.

``ScriptedSource`` and ``RecordingSink`` are test doubles for a metrics source and a sink: the
source returns dcgm-shaped matrices built from the shared signal generators (or raises what the
test scripts), the sink records what it receives (or raises). The analysis is the real one.
Where back-off timing matters, time is a ``FakeClock`` advanced one interval per cycle.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from profiler_app.daemon import Daemon
from profiler_app.errors import ItemsFailedError, RetryLaterError, SourceError
from profiler_app.model import FB_USED, GPU_UTIL, CycleResult, PodIoSeries, PodPeak, SeriesMatrix
from profiler_app.sinks.metrics import Heartbeat, MetricsSink
from profiler_app.sinks.store import TableStore
from profiler_app.sources.kube_pods import PodInfo
from profiler_app.sources.kube_pods import pod_info as parse_pod
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


def test_a_cycle_classifies_and_publishes_everywhere() -> None:
    store = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), store, pods=lambda: [pod_info()])
    assert daemon.run_cycle()
    (result,) = store.received
    assert result.node == "node-a"
    assert result.window_seconds == 1800.0
    assert [(gpu.gpu, gpu.job_type) for gpu in result.gpus] == [("0", "training"), ("1", "idle")]
    assert result.gpus[0].period_seconds == pytest.approx(120.0, rel=0.1)
    assert (result.gpus[0].namespace, result.gpus[0].pod) == ("ml", "trainer-0")
    assert result.gpus[1].pod is None
    (pod,) = result.pods
    assert (pod.namespace, pod.pod, pod.gpus) == ("ml", "trainer-0", ("0",))
    assert pod.fb_used_max_mib == 61_000.0
    assert pod.cpu_util_max == 150.0
    assert pod.start_time == datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    assert result.host == {"cpu_percent": 5.0}
    sample = metrics.registry.get_sample_value
    assert sample("gpu_profiler_last_success_timestamp_seconds") == pytest.approx(
        time.time(), abs=5
    )
    assert sample("gpu_profiler_cycle_duration_seconds_count") == 1.0
    job = {"Hostname": "node-a", "gpu": "0", "UUID": "GPU-0", "namespace": "ml", "pod": "trainer-0"}
    job |= {"GPU_I_ID": "", "GPU_I_PROFILE": ""}  # a whole GPU
    assert sample("gpu_profiler_gpu_job_type", {**job, "job_type": "training"}) == 1.0


def test_the_pods_owner_is_the_prior_for_a_flat_busy_gpu() -> None:
    """GPU 1 of the same pod reads a flat 93 %: its sibling's loop and the PyTorchJob owner
    make it training; the owner is named in the pod's usage and the GPUs' reasons."""

    class FlatSibling(ScriptedSource):
        def read(self, window_seconds: float) -> list[SeriesMatrix]:
            util, fb = super().read(window_seconds)
            labels = [dict(series, pod_uid=POD_UID) for series in util.labels]
            values = util.values.copy()
            values[1] = 93.0
            return [SeriesMatrix(GPU_UTIL, labels, util.timestamps, values, STEP), fb]

    owned = replace(pod_info(), owner_kind="PyTorchJob", owner_name="llama", gpu_requests=2)
    store = RecordingSink("store")
    daemon, _ = make_daemon(FlatSibling(), store, pods=lambda: [owned])
    assert daemon.run_cycle()
    (result,) = store.received
    first, second = result.gpus
    assert (first.job_type, second.job_type) == ("training", "training")
    assert second.reasons[0] == "sibling gpu 0 periodic"
    assert second.reasons[-1] == "owner PyTorchJob"
    assert (second.owner_kind, second.owner_name) == ("PyTorchJob", "llama")
    assert [(pod.pod, pod.gpus, pod.owner_kind) for pod in result.pods] == [
        ("trainer-0", ("0", "1"), "PyTorchJob")
    ]


def manifest(owner: tuple[str, str] | None, image: str, *, args: list[str]) -> dict[str, object]:
    """GPU 0's pod (uid ``POD_UID``) as the API server lists it."""
    metadata: dict[str, object] = {
        "uid": POD_UID,
        "namespace": "ml",
        "name": "gen-0",
        "labels": {"pod-template-hash": "5d8f"},
    }
    if owner is not None:
        metadata["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    container = {
        "name": "main",
        "image": image,
        "args": args,
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": "node-a",
            "containers": [container, {"name": "proxy", "image": "envoy"}],
        },
        "status": {"phase": "Running", "startTime": "2026-11-22T03:00:00Z"},
    }


def run_with_pod(pod: PodInfo) -> CycleResult:
    store = RecordingSink("store")
    daemon, _ = make_daemon(ScriptedSource(), store, pods=lambda: [pod])
    assert daemon.run_cycle()
    (result,) = store.received
    return result


def test_without_workload_context_a_loop_is_training_that_says_so() -> None:
    gpu = run_with_pod(pod_info()).gpus[0]
    assert (gpu.job_type, gpu.basis) == ("training", "util-loop")
    assert gpu.reasons[-1] == "no workload context"
    assert (gpu.engine, gpu.framework) == (None, None)


def test_a_serving_owner_makes_the_daemons_loop_a_request_cadence() -> None:
    """The pod's controller is a Deployment's ReplicaSet: the same loop is requests arriving
    at a steady rhythm, not training iterations."""
    pod = parse_pod(manifest(("ReplicaSet", "gen-5d8f"), "registry.example.com/gen:1", args=[]))

    gpu = run_with_pod(pod).gpus[0]

    assert (gpu.job_type, gpu.basis, gpu.period_seconds) == ("inference", "cadence", None)
    assert gpu.reasons[-2:] == ("loop in a serving workload", "owner Deployment")
    assert (gpu.owner_kind, gpu.owner_name) == ("Deployment", "gen")


def test_a_serving_engine_in_the_image_outweighs_a_training_owner() -> None:
    """Offline generation in a Job: the owner says training, the vLLM image says serving, and the
    engine wins. Engine and framework reach the profile (and so JSON, annotations, metrics and
    the store)."""
    pod = parse_pod(
        manifest(("Job", "batch-gen"), "vllm/vllm-openai:v0.6.3", args=["--model", "m"])
    )
    assert pod.identity is not None
    assert pod.identity.engine == "vllm"

    gpu = run_with_pod(pod).gpus[0]

    assert (gpu.job_type, gpu.basis) == ("inference", "cadence")
    assert (gpu.engine, gpu.framework) == ("vllm", "pytorch")
    assert gpu.reasons[-3:] == ("loop in a serving workload", "engine vllm (serving)", "owner Job")


def test_a_training_launcher_in_the_command_keeps_a_deployments_loop_training() -> None:
    pod = parse_pod(
        manifest(
            ("ReplicaSet", "gen-5d8f"),
            "nvcr.io/nvidia/pytorch:24.08-py3",
            args=["torchrun", "--nproc-per-node=8", "train.py"],
        )
    )

    gpu = run_with_pod(pod).gpus[0]

    assert (gpu.job_type, gpu.engine, gpu.framework) == ("training", "torchrun", "pytorch")
    assert gpu.reasons[-2:] == ("engine torchrun (training)", "owner Deployment")


def test_a_failing_sink_does_not_stop_the_others_and_backs_off() -> None:
    kubernetes = RecordingSink("kubernetes", failures=3)
    store = RecordingSink("store")
    clock = FakeClock()
    daemon, metrics = make_daemon(ScriptedSource(), kubernetes, store, clock=clock)
    outcomes = cycles_every_interval(daemon, clock, 9)
    assert len(store.received) == 9
    # Failures 1, 2, 3 wait 1, 2, 4 intervals: attempts at cycles 1, 2, 4, then 8 and 9 succeed.
    assert kubernetes.attempts == 5
    assert len(kubernetes.received) == 2
    assert outcomes == [False, False, False, False, False, False, False, True, True]
    assert errors(metrics, "kubernetes") == 3
    assert errors(metrics, "store") == 0
    assert metrics.registry.get_sample_value("gpu_profiler_cycle_duration_seconds_count") == 9


def test_source_failures_back_off_and_recover() -> None:
    source = ScriptedSource([SourceError("connection refused"), SourceError("HTTP 503"), None])
    store = RecordingSink("store")
    clock = FakeClock()
    daemon, metrics = make_daemon(source, store, clock=clock)
    # Failures at cycles 1 and 2 wait 1 and 2 intervals: cycle 3 reads nothing, cycle 4 works.
    assert cycles_every_interval(daemon, clock, 4) == [False, False, False, True]
    assert source.reads == 3
    assert len(store.received) == 1
    assert errors(metrics, "source") == 2
    assert failures(metrics, "source") == 0


def test_a_waiting_sink_is_not_a_success(caplog: pytest.LogCaptureFixture) -> None:
    """While a sink waits out a Retry-After, cycles are not done: last_success stays, nothing
    is logged as recovered and the back-off is not reset; /healthz names the failing sink."""
    caplog.set_level(logging.INFO, logger="profiler_app.daemon")
    kubernetes = RecordingSink(
        "kubernetes", failures=2, error=RetryLaterError("HTTP 429", retry_after=120)
    )
    clock = FakeClock(start=1_700_000_000.0)
    daemon, metrics = make_daemon(ScriptedSource(), kubernetes, clock=clock)
    last_success = "gpu_profiler_last_success_timestamp_seconds"

    outcomes = cycles_every_interval(daemon, clock, 9)

    # 429 at t=0 (wait 120 s), cycles at 30..90 wait, 429 again at 120 (wait 120 s: Retry-After
    # beats the doubled 60 s), cycles at 150..210 wait, success at 240.
    assert outcomes == [False] * 8 + [True]
    assert kubernetes.attempts == 3
    assert metrics.registry.get_sample_value(last_success) == 1_700_000_000.0 + 240
    assert caplog.text.count("kubernetes recovered after 2 failure(s)") == 1
    assert "next try in 120s" in caplog.text
    assert errors(metrics, "kubernetes") == 2
    assert failures(metrics, "kubernetes") == 0


def test_health_tells_the_truth_during_an_outage() -> None:
    kubernetes = RecordingSink("kubernetes", failures=100)
    clock = FakeClock()
    daemon, metrics = make_daemon(ScriptedSource(), kubernetes, clock=clock)
    cycles_every_interval(daemon, clock, 20)  # 10 minutes
    # Tries at 0, 0.5, 1.5, 3.5 and 7.5 minutes (waits of 1, 2, 4, 8 intervals), none between.
    assert kubernetes.attempts == 5
    assert failures(metrics, "kubernetes") == 5
    summary = metrics.health_summary()
    assert "no success yet" in summary
    assert "failing: kubernetes (5 in a row)" in summary


def test_unexpected_exceptions_are_counted_not_fatal() -> None:
    source = ScriptedSource([ValueError("bad json"), None])
    clock = FakeClock()
    daemon, metrics = make_daemon(source, RecordingSink("store"), clock=clock)
    assert daemon.run(once=True) == 1
    clock.advance(daemon.interval_seconds)
    assert daemon.run(once=True) == 0
    assert errors(metrics, "source") == 1


def test_loop_waits_the_backed_off_interval_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="profiler_app.daemon")
    source = ScriptedSource([SourceError("down")] * 3)
    store = RecordingSink("store")
    daemon, _ = make_daemon(source, store, interval=0.05)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not store.received and time.monotonic() < deadline:
        time.sleep(0.02)
    daemon.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert source.reads >= 4
    assert store.received
    assert "source recovered after 3 failure(s)" in caplog.text


def test_stop_abandons_a_hung_cycle_quickly() -> None:
    source = ScriptedSource()
    source.block = threading.Event()
    store = RecordingSink("store")
    daemon, _ = make_daemon(source, store)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    daemon.stop()
    thread.join(5)
    assert exit_codes == [0]
    assert time.monotonic() - started < 3
    source.block.set()


def test_close_stops_the_sources_before_the_sinks() -> None:
    order: list[str] = []
    sources = contextlib.ExitStack()
    sources.callback(order.append, "stop pod watcher")
    sources.callback(order.append, "stop sampler")
    daemon, _ = make_daemon(ScriptedSource(), RecordingSink("store", log=order), sources=sources)
    assert daemon.run(once=True) == 0
    assert daemon.close()
    assert order == ["stop sampler", "stop pod watcher", "close store"]


def test_nothing_is_closed_under_an_abandoned_cycle() -> None:
    """A cycle hung past the stop grace keeps its sources and sinks open; once it has ended,
    close works as usual."""
    order: list[str] = []
    sources = contextlib.ExitStack()
    sources.callback(order.append, "stop sampler")
    source = ScriptedSource()
    source.block = threading.Event()
    store = RecordingSink("store", log=order)
    daemon, _ = make_daemon(source, store, sources=sources)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    time.sleep(0.2)
    daemon.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert not daemon.close()
    assert order == []
    source.block.set()
    deadline = time.monotonic() + 5
    while not daemon.close() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert order == ["stop sampler", "close store"]


def test_close_survives_a_failing_sink() -> None:
    class BrokenClose(RecordingSink):
        def close(self) -> None:
            raise OSError("flush failed")

    broken = BrokenClose("store")
    other = RecordingSink("kubernetes")
    daemon, _ = make_daemon(ScriptedSource(), broken, other)
    daemon.close()
    assert other.closed


def test_no_gpus_still_publishes_the_host() -> None:
    class NoGpus(ScriptedSource):
        def read(self, window_seconds: float) -> list[SeriesMatrix]:
            return []

    store = RecordingSink("store")
    daemon, _ = make_daemon(NoGpus(), store)
    assert daemon.run_cycle()
    assert store.received[0].gpus == []
    assert store.received[0].host == {"cpu_percent": 5.0}


def test_heartbeat_stays_fresh_while_backing_off() -> None:
    """A loop waiting out a long backoff is alive; /healthz must not restart it."""
    source = ScriptedSource([SourceError("down")] * 50)
    daemon, metrics = make_daemon(source, interval=0.1, stale_after=0.3)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        while daemon.cycle.source_part.backoff.failures < 4:  # waits of 0.8 s and more
            time.sleep(0.05)
        ages = []
        for _ in range(20):
            ages.append(metrics.heartbeat.age())
            time.sleep(0.05)
        assert max(ages) < 0.3
    finally:
        daemon.stop()
        thread.join(5)


def test_heartbeat_goes_stale_while_a_cycle_hangs() -> None:
    source = ScriptedSource()
    source.block = threading.Event()
    daemon, metrics = make_daemon(source, interval=0.1, stale_after=0.3)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        time.sleep(0.6)
        assert not metrics.heartbeat.alive()
    finally:
        daemon.stop()
        thread.join(5)
        source.block.set()


def test_a_gpu_first_seen_on_a_node_ten_minutes_old_is_credited_ten_minutes(
    tmp_path: Path,
) -> None:
    """The window is 30 minutes but the node (and its exporter) started 10 minutes ago: the
    GPU's first stored row must not claim the 20 minutes before its first sample."""

    class YoungNode(ScriptedSource):
        def read(self, window_seconds: float) -> list[SeriesMatrix]:
            timestamps = time.time() - STEP * np.arange(POINTS)[::-1]
            young = []
            for matrix in super().read(window_seconds):
                values = matrix.values.copy()
                values[:, : POINTS - 60] = np.nan  # samples for the last 60 steps only
                young.append(replace(matrix, timestamps=timestamps, values=values))
            return young

    database = tmp_path / "profiler.db"
    store = TableStore(f"sqlite:///{database}")
    daemon, _ = make_daemon(YoungNode(), store)  # type: ignore[arg-type]
    assert daemon.run_cycle()
    store.close()

    with sqlite3.connect(database) as connection:
        covered = connection.execute("SELECT gpu, covers_seconds FROM gpu_window").fetchall()
    assert [gpu for gpu, _ in covered] == ["0", "1"]
    assert [seconds for _, seconds in covered] == [pytest.approx(59 * STEP, abs=5)] * 2


def test_until_the_first_pod_list_no_pod_is_reported_and_health_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listed: list[PodInfo] | None = None
    store = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), store, pods=lambda: listed)

    assert daemon.run_cycle()
    first = store.received[-1]
    assert (first.pods, first.node_pods) == ([], None)
    assert [gpu.job_type for gpu in first.gpus] == ["training", "idle"]  # GPUs go on
    assert "no pod list from Kubernetes for" in metrics.health_summary()

    listed = [pod_info()]
    with caplog.at_level(logging.INFO):
        assert daemon.run_cycle()
    second = store.received[-1]
    assert [pod.pod for pod in second.pods] == ["trainer-0"]
    assert second.node_pods == (pod_info(),)
    assert "no pod list" not in metrics.health_summary()
    assert "pod list arrived from Kubernetes" in caplog.text


def test_without_kubernetes_there_are_no_node_pods_and_no_waiting() -> None:
    store = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), store)
    assert daemon.run_cycle()
    assert store.received[-1].node_pods is None
    assert "no pod list" not in metrics.health_summary()


# -- sinks that act on the pods alone; sinks failing for some pods only --------------------------


class PodsOnlySink(RecordingSink):
    """Like the training protector: it acts on the pod list without GPU series."""

    acts_without_metrics = True


def test_while_the_source_fails_only_the_sinks_that_need_no_metrics_get_the_pods() -> None:
    clock = FakeClock()
    source = ScriptedSource([SourceError("prometheus is down")] * 2)
    protection, store = PodsOnlySink("protection"), RecordingSink("store")
    daemon, metrics = make_daemon(source, protection, store, pods=lambda: [pod_info()], clock=clock)

    assert cycles_every_interval(daemon, clock, 2) == [False, False]

    assert store.received == []
    assert [(r.gpus, r.gpus_read) for r in protection.received] == [([], False)] * 2
    assert protection.received[0].node_pods == (pod_info(),)
    assert errors(metrics, "source") == 2
    assert daemon.run_cycle() is False  # the source waits out its back-off: the pods go on
    assert len(protection.received) == 3
    assert source.reads == 2
    clock.advance(120)
    assert daemon.run_cycle() is True
    assert protection.received[-1].gpus_read is True


def test_a_sink_failing_for_some_pods_is_not_backed_off_and_health_names_them() -> None:
    clock = FakeClock()
    failing = {"aaa/old": "HTTP 500 Internal Server Error, 1 in a row"}
    protection = PodsOnlySink("protection", failures=2, error=ItemsFailedError("x", failing, 1))
    daemon, metrics = make_daemon(ScriptedSource(), protection, clock=clock)

    assert cycles_every_interval(daemon, clock, 3) == [False, False, True]

    assert protection.attempts == 3  # tried every cycle: the pods back off on their own
    assert failures(metrics, "protection") == 0
    assert errors(metrics, "protection") == 2
    gauge = metrics.registry.get_sample_value("gpu_profiler_failing_pods", {"kind": "protection"})
    assert gauge == 0
    protection.failures = 1
    daemon.run_cycle()
    assert "protection failing for 1 pod(s): aaa/old (HTTP 500" in metrics.health_summary()
