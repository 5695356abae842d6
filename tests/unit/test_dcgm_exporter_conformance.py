"""The dcgm-exporter test double (tests/support/dcgm.py) against the exporter's source, one test
per upstream shape, and what the profiles read from each.

Sources, NVIDIA/dcgm-exporter (docs/sharing.md, "Upstream versions read"):
``internal/pkg/transformation/kubernetes.go``, ``process_metrics.go`` and ``const.go`` at tag
4.5.3-4.8.2 and, for the shape before per-process series, at 4.5.2-4.8.1 (unchanged since
4.4.2-4.7.1); ``internal/pkg/rendermetrics/render_metrics.go`` at 4.5.3-4.8.2 and at commit
d5e5f51 on main.
"""

from __future__ import annotations

import numpy as np
import pytest

from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    POWER_USAGE,
    SHARED_NOT_ATTRIBUTABLE,
    SHARED_PER_POD,
    GpuProfile,
    PodUsage,
    SeriesMatrix,
)
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.exporter_series import NODE_LABELS, PER_PROCESS_FIELDS, POD_UID_LABEL
from profiler_app.profiles.pods import pod_usage
from profiler_app.profiles.timelines import VGPU_LABEL
from tests.support import dcgm
from tests.support.dcgm import (
    EXPORTER_SHAPES,
    MIXED_FIELDS,
    SHARED_PODS,
    TRAINER,
    ExporterShape,
    Gpu,
    Holder,
    NodeGpu,
    mixed_node,
    node_series,
    sample_times,
)

NODE = "node-a"
TIMES = sample_times(180, 10.0, end=1_800_000_000.0)
SHAPES = {shape.name: shape for shape in EXPORTER_SHAPES}


def shape_of(name: str) -> ExporterShape:
    return SHAPES[name]


def pods_by_gpu(series: list[dcgm.Series], field: str) -> dict[str, list[str | None]]:
    found: dict[str, list[str | None]] = {}
    for name, labels, _ in series:
        if name == field:
            found.setdefault(labels["gpu"], []).append(labels.get("pod"))
    return found


def unused_gpus_node(shape: ExporterShape, field: str) -> list[dcgm.Series]:
    """The fixture of upstream's TestKubernetesVirtualGPUs_UnusedGPUsPreserveMetrics
    (kubernetes_test.go lines 1448-1563 at 4.5.3-4.8.2): three GPUs, one held by one pod."""
    values = {field: np.full(TIMES.size, 42.0)}
    gpus = [
        NodeGpu(
            Gpu(NODE, index),
            values,
            (Holder("default", "gpu-pod-0", "uid-0"),) if index == 0 else (),
        )
        for index in range(3)
    ]
    return node_series(shape, gpus)


# -- The double against the source -------------------------------------------------------------


def test_only_gpu_util_and_fb_used_have_per_process_series() -> None:
    """process_metrics.go lines 30-32 (4.5.3-4.8.2): isPerProcessMetric."""
    assert set(dcgm.PER_PROCESS_FIELDS) == set(PER_PROCESS_FIELDS) == {GPU_UTIL, FB_USED}


def test_label_names_are_the_exporters() -> None:
    """const.go lines 21-25 (4.5.3-4.8.2): pod, namespace, container, pod_uid, vgpu."""
    holder = Holder("ml", "p", "u-1", vgpu="3")
    labels = dcgm._pod_labels(holder, uid=True)
    assert labels == {
        "pod": "p",
        "namespace": "ml",
        "container": "main",
        POD_UID_LABEL: "u-1",
        VGPU_LABEL: "3",
    }


def test_without_virtual_gpus_the_device_series_is_labelled_in_place() -> None:
    """kubernetes.go lines 412-451 (4.5.3-4.8.2): one series per GPU and field, the pod's
    labels on it (the last container of a shared GPU: toDeviceToPod, lines 887-909), pod_uid
    only with pod UIDs on (line 435), no vgpu."""
    for name in ("classic", "classic-pod-uid"):
        series = mixed_node(shape_of(name), NODE, TIMES)
        assert pods_by_gpu(series, POWER_USAGE) == {"0": ["pod-b"], "1": [TRAINER], "2": [None]}
        assert all(VGPU_LABEL not in labels for _, labels, _ in series)
        uids = {labels.get(POD_UID_LABEL) for _, labels, _ in series if labels.get("pod")}
        assert uids == ({"uid-pod-b", f"uid-{TRAINER}"} if name.endswith("uid") else {None})


def test_before_4_5_3_every_field_is_copied_per_pod_and_unused_gpus_vanish() -> None:
    """kubernetes.go lines 246-296 (4.5.2-4.8.1, as in 4.4.2-4.7.1): per pod a copy of the
    device's series (pod_uid at line 281, vgpu at 282-284); line 292 keeps only the copies, so
    a GPU without a pod has no series once another GPU of the node has one."""
    series = mixed_node(shape_of("copies-before-4.5.3"), NODE, TIMES)
    for field in MIXED_FIELDS:
        assert pods_by_gpu(series, field) == {"0": ["pod-a", "pod-b"], "1": [TRAINER]}
    copies = [
        values for name, labels, values in series if name == GPU_UTIL and labels["gpu"] == "0"
    ]
    np.testing.assert_array_equal(copies[0], copies[1])  # the device's values, twice
    for field in (POWER_USAGE, GPU_UTIL):
        left = unused_gpus_node(shape_of("copies-before-4.5.3"), field)
        assert [labels.get("pod") for _, labels, _ in left] == ["gpu-pod-0"]


@pytest.mark.parametrize(("field", "pods", "devices"), [(POWER_USAGE, 1, 2), (GPU_UTIL, 1, 3)])
def test_from_4_5_3_unused_gpus_keep_their_series(field: str, pods: int, devices: int) -> None:
    """kubernetes.go lines 399-403 (4.5.3-4.8.2), and the counts upstream's own test expects
    (kubernetes_test.go lines 1448-1563): a per-process field keeps the held GPU's device
    series too (line 366)."""
    series = unused_gpus_node(shape_of("per-process"), field)
    named = [labels for _, labels, _ in series if "pod" in labels]
    assert (len(named), len(series) - len(named)) == (pods, devices)


def test_from_4_5_3_per_process_series_sit_beside_the_device_series() -> None:
    """kubernetes.go lines 359-369 and 201-252 (4.5.3-4.8.2): GPU_UTIL and FB_USED keep the
    device series without pod labels (line 366) and add one per pod with pod_uid (line 243),
    reading 0 for a pod whose processes are not mapped (buildIdlePodValues, lines 271-279):
    without pod UIDs every pod, and pod_uid is then empty, which Prometheus drops. Other
    fields: a copy per pod, pod_uid only with pod UIDs on (line 385)."""
    without = mixed_node(shape_of("per-process"), NODE, TIMES)
    with_uid = mixed_node(shape_of("per-process-pod-uid"), NODE, TIMES)
    for series in (without, with_uid):
        assert pods_by_gpu(series, GPU_UTIL) == {
            "0": [None, "pod-a", "pod-b"],
            "1": [None, TRAINER],
            "2": [None],
        }
        assert pods_by_gpu(series, POWER_USAGE) == {
            "0": ["pod-a", "pod-b"],
            "1": [TRAINER],
            "2": [None],
        }
    own = {
        labels["pod"]: (labels.get(POD_UID_LABEL), float(values.max()))
        for name, labels, values in with_uid
        if name == FB_USED and labels.get("pod") and labels["gpu"] == "0"
    }
    assert own == {"pod-a": ("uid-pod-a", 10_000.0), "pod-b": ("uid-pod-b", 4_000.0)}
    zeros = [v for n, labels, v in without if n in PER_PROCESS_FIELDS and labels.get("pod")]
    assert len(zeros) == 6  # GPU_UTIL and FB_USED of pod-a, pod-b and the trainer
    assert all(not values.any() for values in zeros)
    assert all(POD_UID_LABEL not in labels for _, labels, _ in without)
    power = [labels for n, labels, _ in with_uid if n == POWER_USAGE and labels.get("pod")]
    assert all(labels[POD_UID_LABEL] for labels in power)


def test_the_node_label_is_hostname_after_4_5_3() -> None:
    """render_metrics.go line 47: ``Hostname`` at 4.5.3-4.8.2, ``hostname`` at d5e5f51."""
    assert NODE_LABELS == ("Hostname", "hostname")
    (_, labels, _), *_ = mixed_node(shape_of("per-process-pod-uid-hostname"), NODE, TIMES)
    assert labels["hostname"] == NODE
    assert "Hostname" not in labels


# -- What the profiles read from each shape ----------------------------------------------------


def matrices(series: list[dcgm.Series]) -> list[SeriesMatrix]:
    found = []
    for field in MIXED_FIELDS:
        rows = [(labels, values) for name, labels, values in series if name == field]
        values = np.vstack([values for _, values in rows])
        found.append(SeriesMatrix(field, [labels for labels, _ in rows], TIMES, values, 10.0))
    return found


def read(shape: ExporterShape) -> tuple[list[GpuProfile], dict[str, PodUsage]]:
    profiles = build_profiles(matrices(mixed_node(shape, NODE, TIMES)))
    usage = {pod.pod: pod for pod in pod_usage(profiles, [], {}, NODE)}
    return profiles, usage


@pytest.mark.parametrize("shape", EXPORTER_SHAPES, ids=lambda shape: shape.name)
def test_every_shape_one_profile_per_gpu_and_the_whole_gpu_is_its_pods(
    shape: ExporterShape,
) -> None:
    profiles, usage = read(shape)
    gpus = ["0", "1"] if shape.name.startswith("copies") else ["0", "1", "2"]
    assert [profile.gpu for profile in profiles] == gpus
    assert {profile.hostname for profile in profiles} == {NODE}
    whole = profiles[1]
    assert (whole.pod, whole.sharing, whole.job_type) == (TRAINER, "none", "training")
    assert whole.stats[GPU_UTIL].max > 90  # the device's values, never the per-pod zeros
    assert all(POWER_USAGE in profile.stats for profile in profiles)
    assert (usage[TRAINER].gpus, usage[TRAINER].gpu_attribution) == (("1",), None)
    assert usage[TRAINER].gpu_util_max == whole.stats[GPU_UTIL].max
    for profile in profiles[2:]:
        assert (profile.pod, profile.pods, profile.job_type) == (None, (), "idle")


@pytest.mark.parametrize(
    "shape", [s for s in EXPORTER_SHAPES if s.virtual_gpus], ids=lambda shape: shape.name
)
def test_virtual_gpu_shapes_list_the_shared_pods_with_their_own_peaks_or_none(
    shape: ExporterShape,
) -> None:
    profiles, usage = read(shape)
    shared = profiles[0]
    assert shared.sharing == "time-slicing"
    assert shared.stats[GPU_UTIL].mean == pytest.approx(80.0, abs=1.0)  # the device's
    assert [(share.pod, share.share) for share in shared.pods] == [("pod-a", 1.0), ("pod-b", 1.0)]
    own = shape.per_process and shape.pod_uid
    for pod, _, util, fb in SHARED_PODS:
        peaks = (usage[pod].gpu_util_max, usage[pod].fb_used_max_mib, usage[pod].gpu_attribution)
        assert peaks == (
            (util, fb, SHARED_PER_POD) if own else (None, None, SHARED_NOT_ATTRIBUTABLE)
        )


def test_a_per_pod_zero_without_pod_uid_is_never_a_peak() -> None:
    """The 4.5.3-4.8.2 shape without pod UIDs: each pod's GPU_UTIL and FB_USED read 0 beside
    the device's; they say where the pods were, nothing about their use."""
    profiles, usage = read(shape_of("per-process"))
    assert all(profile.pod_peaks == () for profile in profiles)
    assert all(0.0 not in (pod.gpu_util_max, pod.fb_used_max_mib) for pod in usage.values())
