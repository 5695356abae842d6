"""Time-sliced GPUs against a real Prometheus: each pod gets its own peaks, or none.

The backfill is shaped as dcgm-exporter 4.5.3+ exports a time-sliced node with
``KUBERNETES_VIRTUAL_GPUS`` on: per pod a copy of the device's series labelled with the pod and
its ``vgpu`` replica, and, where NVML's per-process accounting has them, per-pod
``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` series labelled with the pod's ``uid``.
GPU 0 has both, GPU 1 only the copies, GPU 2 is a whole GPU of one pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pytest
import sqlalchemy as sa

from profiler_app.commands.options import DEFAULT_FIELDS
from profiler_app.model import (
    FB_USED,
    GPU_UTIL,
    SHARED_NOT_ATTRIBUTABLE,
    SHARED_PER_POD,
    CycleResult,
    GpuProfile,
)
from profiler_app.pods import pod_usage
from profiler_app.profiles import build_profiles
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import gpu_window
from profiler_app.sinks.store.models import pod_usage as pod_usage_table
from profiler_app.sinks.store.urls import parse_store_url
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.dcgm import OpenMetricsBuilder, sample_times
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

NODE = "ts-node"
STEP = 10.0
POINTS = 180
# Pod, its replica on its GPU, its own utilisation and framebuffer (None: no per-pod series).
SHARED_WITH_OWN = (("pod-a", "0", 60.0, 10000.0), ("pod-b", "1", 20.0, 4000.0))
SHARED_WITHOUT = (("pod-c", "0", None, None), ("pod-d", "1", None, None))


def gpu_labels(index: int) -> dict[str, str]:
    return {
        "gpu": str(index),
        "UUID": f"GPU-0000000{index}-ts",
        "device": f"nvidia{index}",
        "modelName": "NVIDIA L4",
        "Hostname": NODE,
    }


def time_sliced_backfill() -> str:
    rng = np.random.default_rng(5)
    times = sample_times(POINTS, STEP)
    builder = OpenMetricsBuilder()

    def steady(level: float) -> np.ndarray:
        return np.clip(level + rng.normal(0, 1.5, POINTS), 0, 100)

    for index, pods, device_util, device_fb in (
        (0, SHARED_WITH_OWN, 80.0, 14000.0),
        (1, SHARED_WITHOUT, 50.0, 9000.0),
    ):
        util = steady(device_util)
        for pod, replica, own_util, own_fb in pods:
            copy = gpu_labels(index) | {"namespace": "ml", "pod": pod, "vgpu": replica}
            builder.add(GPU_UTIL, copy, util, times)
            builder.add(FB_USED, copy, np.full(POINTS, device_fb), times)
            if own_util is not None and own_fb is not None:
                own = copy | {"uid": f"uid-{pod}"}
                builder.add(GPU_UTIL, own, np.minimum(util, own_util), times)
                builder.add(FB_USED, own, np.full(POINTS, own_fb), times)
    whole = gpu_labels(2) | {"namespace": "ml", "pod": "pod-e"}
    builder.add(GPU_UTIL, whole, np.full(POINTS, 90.0), times)
    builder.add(FB_USED, whole, np.full(POINTS, 30000.0), times)
    return builder.text()


@pytest.fixture(scope="module")
def profiles() -> Iterator[list[GpuProfile]]:
    with PrometheusServer(time_sliced_backfill()) as server:
        source = PrometheusSource(
            server.url, NODE, fields=DEFAULT_FIELDS, optional_fields=DEFAULT_FIELDS[1:]
        )
        try:
            yield build_profiles(source.read(1800.0))
        finally:
            source.close()


def test_each_physical_gpu_is_classified_once(profiles: list[GpuProfile]) -> None:
    assert [(p.gpu, p.sharing) for p in profiles] == [
        ("0", "time-slicing"),
        ("1", "time-slicing"),
        ("2", "none"),
    ]
    # The device's utilisation, from its copies, not the per-pod series.
    assert profiles[0].stats[GPU_UTIL].mean == pytest.approx(80.0, abs=1.0)
    assert profiles[0].stats[FB_USED].max == 14000.0
    assert [(s.pod, round(s.share, 2)) for s in profiles[0].pods] == [
        ("pod-a", 1.0),
        ("pod-b", 1.0),
    ]
    assert [(s.pod, round(s.share, 2)) for s in profiles[1].pods] == [
        ("pod-c", 1.0),
        ("pod-d", 1.0),
    ]


def test_pods_get_their_own_peaks_or_none(profiles: list[GpuProfile]) -> None:
    usage = {p.pod: p for p in pod_usage(profiles, [], {}, NODE)}
    assert set(usage) == {"pod-a", "pod-b", "pod-c", "pod-d", "pod-e"}
    for pod, _, util, fb in SHARED_WITH_OWN:
        assert usage[pod].gpu_util_max == pytest.approx(util, abs=5.0)
        assert usage[pod].fb_used_max_mib == fb
        assert usage[pod].gpu_attribution == SHARED_PER_POD
        assert usage[pod].gpus == ("0",)
    for pod, *_ in SHARED_WITHOUT:
        # Never the whole GPU's 50 % and 9000 MiB.
        assert usage[pod].gpu_util_max is None
        assert usage[pod].fb_used_max_mib is None
        assert usage[pod].gpu_attribution == SHARED_NOT_ATTRIBUTABLE
    assert usage["pod-e"].gpu_util_max == 90.0
    assert usage["pod-e"].gpu_attribution is None


def test_the_store_keeps_the_sharing_and_the_attribution(
    profiles: list[GpuProfile], tmp_path: object
) -> None:
    url = f"sqlite:///{tmp_path}/profiler.db"
    result = CycleResult(
        NODE, datetime.now(UTC), 1800.0, profiles, pods=pod_usage(profiles, [], {}, NODE)
    )
    store = TableStore(url)
    try:
        store.publish(result)
    finally:
        store.close()
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            g, p = gpu_window.c, pod_usage_table.c
            gpus = connection.execute(sa.select(g.gpu, g.sharing).order_by(g.gpu)).all()
            pods = connection.execute(
                sa.select(p.pod, p.gpu_util_max, p.fb_used_max_mib, p.gpu_attribution).order_by(
                    p.pod
                )
            ).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in gpus] == [
        ("0", "time-slicing"),
        ("1", "time-slicing"),
        ("2", "none"),
    ]
    by_pod = {row[0]: tuple(row[1:]) for row in pods}
    assert by_pod["pod-b"][1:] == (4000.0, SHARED_PER_POD)
    assert by_pod["pod-c"] == (None, None, SHARED_NOT_ATTRIBUTABLE)
    assert by_pod["pod-e"] == (90.0, 30000.0, None)
