"""The daemon's cycle with pods' disk and network rates: they reach the pods' usage, a training
GPU's reasons say when its stalls follow its pod's reads, a pod on the host's network gets no
network numbers, and a failed read costs the cycle nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pytest

from profiler_app.core.errors import SourceError
from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    GPU_UTIL,
    NETWORK_RECEIVE,
    PodIoSeries,
)
from profiler_app.sources.kube_pods import pod_info as parse_pod
from tests.support.apiserver.objects import pod_manifest
from tests.support.daemon_doubles import (
    POD_UID,
    RecordingSink,
    ScriptedSource,
    errors,
    make_daemon,
    node_matrices,
    pod_info,
)

MB = 1e6
KEY = ("ml", "trainer-0")


def gpu0() -> tuple[np.ndarray, np.ndarray]:
    util = next(matrix for matrix in node_matrices() if matrix.field == GPU_UTIL)
    return util.timestamps, util.values[0]


def reads_at_stall_onsets() -> PodIoSeries:
    """GPU 0's pod reads 300 MB/s as each of its stalls begins, 2 MB/s otherwise; it receives
    a steady 10 MB/s."""
    times, util = gpu0()
    stalled = util <= 0.5 * np.percentile(util, 95)
    onsets = stalled & ~np.concatenate(([False], stalled[:-1]))
    reads = np.where(onsets, 300 * MB, 2 * MB)
    return PodIoSeries(
        times,
        {
            DISK_READ: reads,
            DISK_WRITE: np.full(times.size, 1 * MB),
            NETWORK_RECEIVE: np.full(times.size, 10 * MB),
        },
    )


def steady_reads() -> PodIoSeries:
    times, _ = gpu0()
    return PodIoSeries(times, {DISK_READ: np.full(times.size, 40 * MB)})


def run_with(io: PodIoSeries, *, host_network: bool = False) -> RecordingSink:
    sink = RecordingSink("store")
    listed = replace(pod_info(), host_network=host_network)
    daemon, _ = make_daemon(ScriptedSource(), sink, pods=lambda: [listed])
    daemon.cycle.inputs = replace(
        daemon.cycle.inputs, host=None, metric_pod_io=lambda window: {KEY: io}
    )
    assert daemon.run_cycle()
    return sink


def test_reads_at_each_stall_make_the_training_gpu_input_bound() -> None:
    result = run_with(reads_at_stall_onsets()).received[-1]
    gpu = result.gpus[0]
    assert gpu.job_type == "training"
    assert gpu.reasons[1].startswith("stalls follow disk reads: likely input-bound")
    usage = result.pods[0]
    assert usage.io is not None
    assert usage.io.stat(DISK_READ, "max") == 300 * MB
    assert usage.io.stat(DISK_READ, "p95") == pytest.approx(
        np.percentile(reads_at_stall_onsets().rates[DISK_READ], 95)
    )
    assert usage.io.stat(NETWORK_RECEIVE, "max") == 10 * MB
    assert not any("input-bound" in reason for reason in result.gpus[1].reasons)  # idle


def test_steady_reads_say_nothing_of_the_input() -> None:
    gpu = run_with(steady_reads()).received[-1].gpus[0]
    assert gpu.job_type == "training"
    assert not any("input-bound" in reason for reason in gpu.reasons)


def test_a_pod_on_the_hosts_network_has_no_network_numbers() -> None:
    usage = run_with(reads_at_stall_onsets(), host_network=True).received[-1].pods[0]
    assert usage.io is not None
    assert not usage.io.network_attributable
    assert usage.io.stat(NETWORK_RECEIVE, "max") is None
    assert usage.io.stat(DISK_READ, "max") == 300 * MB


def test_local_readings_win_over_prometheus() -> None:
    times, _ = gpu0()
    local = PodIoSeries(times, {DISK_READ: np.full(times.size, 7 * MB)})

    class Host:
        def snapshot(self) -> dict[str, float]:
            return {}

        def pod_peaks(self) -> dict:
            return {}

        def pod_io(self) -> dict[str, PodIoSeries]:
            return {POD_UID: local}

    sink = RecordingSink("store")
    daemon, _ = make_daemon(ScriptedSource(), sink, pods=lambda: [pod_info()])
    daemon.cycle.inputs = replace(
        daemon.cycle.inputs, host=Host(), metric_pod_io=lambda window: {KEY: steady_reads()}
    )
    assert daemon.run_cycle()
    io = sink.received[-1].pods[0].io
    assert io is not None
    assert io.stat(DISK_READ, "max") == 7 * MB


def test_a_failed_read_is_a_source_error_and_the_cycle_goes_on() -> None:
    calls: list[float] = []

    def failing(window: float) -> Mapping[tuple[str, str], PodIoSeries]:
        calls.append(window)
        raise SourceError("Prometheus timed out")

    sink = RecordingSink("store")
    daemon, metrics = make_daemon(ScriptedSource(), sink, pods=lambda: [pod_info()])
    daemon.cycle.inputs = replace(daemon.cycle.inputs, host=None, metric_pod_io=failing)
    assert daemon.run_cycle()
    assert errors(metrics, "source") == 1
    assert sink.received[-1].pods[0].io is None
    assert calls == [daemon.cycle.analysis.window_seconds]


def test_the_pod_watcher_reads_host_network_from_the_spec() -> None:
    manifest = pod_manifest("ml", "trainer-0", "node-a", gpus=1)
    assert not parse_pod(manifest).host_network
    manifest["spec"]["hostNetwork"] = True
    assert parse_pod(manifest).host_network
