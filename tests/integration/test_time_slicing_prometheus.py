"""Every dcgm-exporter shape through a real Prometheus: the whole GPU keeps its pod, time-sliced
pods get their own peaks where the exporter measured them (``pod_uid``) and none otherwise, and
the store never keeps a per-pod zero as a peak.

One node per exporter shape (tests/support/dcgm.py, ``EXPORTER_SHAPES``, read from
NVIDIA/dcgm-exporter's source), each the mixed node: GPU 0 time-sliced by two pods, GPU 1 whole
to a PyTorchJob's pod, GPU 2 empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from profiler_app.commands.options import DEFAULT_FIELDS
from profiler_app.core.model import (
    GPU_UTIL,
    POWER_USAGE,
    SHARED_NOT_ATTRIBUTABLE,
    SHARED_PER_POD,
    CycleResult,
    GpuProfile,
)
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.pods import pod_usage
from profiler_app.sinks.store import TableStore
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.models import gpu_window
from profiler_app.sinks.store.models import pod_usage as pod_usage_table
from profiler_app.sinks.store.urls import parse_store_url
from profiler_app.sources.prometheus import PrometheusSource
from tests.support.dcgm import (
    EXPORTER_SHAPES,
    SHARED_PODS,
    TRAINER,
    ExporterShape,
    OpenMetricsBuilder,
    mixed_node,
    sample_times,
)
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

STEP = 10.0
POINTS = 360
SHAPE_IDS = [shape.name for shape in EXPORTER_SHAPES]


def node_of(shape: ExporterShape) -> str:
    return f"node-{shape.name}"


def backfill() -> str:
    times = sample_times(POINTS, STEP)
    builder = OpenMetricsBuilder()
    for shape in EXPORTER_SHAPES:
        for field, labels, values in mixed_node(shape, node_of(shape), times):
            builder.add(field, labels, values, times)
    return builder.text()


@pytest.fixture(scope="module")
def server() -> Iterator[PrometheusServer]:
    with PrometheusServer(backfill()) as running:
        yield running


def read(server: PrometheusServer, shape: ExporterShape) -> list[GpuProfile]:
    source = PrometheusSource(
        server.url, node_of(shape), fields=DEFAULT_FIELDS, optional_fields=DEFAULT_FIELDS[1:]
    )
    try:
        return build_profiles(source.read(1800.0))
    finally:
        source.close()


@pytest.mark.parametrize("shape", EXPORTER_SHAPES, ids=SHAPE_IDS)
def test_the_whole_gpu_keeps_its_pod_and_each_gpu_is_classified_once(
    server: PrometheusServer, shape: ExporterShape
) -> None:
    profiles = read(server, shape)
    # Before 4.5.3 an empty GPU has no series once another GPU of its node has a pod.
    gpus = ["0", "1"] if shape.name.startswith("copies") else ["0", "1", "2"]
    assert [profile.gpu for profile in profiles] == gpus
    assert {profile.hostname for profile in profiles} == {node_of(shape)}
    whole = profiles[1]
    assert (whole.pod, whole.sharing, whole.job_type) == (TRAINER, "none", "training")
    assert [share.pod for share in whole.pods] == [TRAINER]
    assert whole.stats[GPU_UTIL].max > 90
    assert all(POWER_USAGE in profile.stats for profile in profiles)
    if shape.virtual_gpus:
        shared = profiles[0]
        assert shared.sharing == "time-slicing"
        assert shared.stats[GPU_UTIL].mean == pytest.approx(80.0, abs=1.0)
        assert [(s.pod, round(s.share, 2)) for s in shared.pods] == [
            ("pod-a", 1.0),
            ("pod-b", 1.0),
        ]


@pytest.mark.parametrize("shape", EXPORTER_SHAPES, ids=SHAPE_IDS)
def test_the_store_keeps_own_peaks_or_none_and_never_a_zero(
    server: PrometheusServer, shape: ExporterShape, tmp_path: Path
) -> None:
    profiles = read(server, shape)
    node = node_of(shape)
    url = f"sqlite:///{tmp_path}/profiler.db"
    store = TableStore(url)
    try:
        store.publish(
            CycleResult(
                node, datetime.now(UTC), 1800.0, profiles, pods=pod_usage(profiles, [], {}, node)
            )
        )
    finally:
        store.close()
    engine = create_store_engine(parse_store_url(url), create_file=False)
    try:
        with engine.connect() as connection:
            g, p = gpu_window.c, pod_usage_table.c
            sharing = dict(connection.execute(sa.select(g.gpu, g.sharing)).all())
            rows = connection.execute(
                sa.select(p.pod, p.gpu_util_max, p.fb_used_max_mib, p.gpu_attribution)
            ).all()
    finally:
        engine.dispose()
    by_pod = {row[0]: tuple(row[1:]) for row in rows}
    assert sharing["1"] == "none"
    util, fb, attribution = by_pod[TRAINER]
    assert (fb, attribution) == (30_000.0, None)
    assert util is not None
    assert util > 90
    for _, gpu_util, fb_used, _ in rows:
        assert gpu_util != 0.0
        assert fb_used != 0.0
    if not shape.virtual_gpus:
        return  # one pod named per GPU (see tests/support/dcgm.py, node_series)
    assert sharing["0"] == "time-slicing"
    own = shape.per_process and shape.pod_uid
    for pod, _, pod_util, pod_fb in SHARED_PODS:
        expected = (
            (pod_util, pod_fb, SHARED_PER_POD) if own else (None, None, SHARED_NOT_ATTRIBUTABLE)
        )
        assert by_pod[pod] == expected
