"""Pod attribution and per-pod peaks (profiler_app/pods.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

from profiler_app.model import FB_USED, FieldStats, PodPeak
from profiler_app.pods import POD_UID_LABEL, attribute_profiles, pod_usage
from profiler_app.sources.kube_pods import PodInfo
from tests.support.cycles import gpu_profile

START = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def pod(name: str, uid: str, gpus: int = 1) -> PodInfo:
    return PodInfo(
        uid=uid,
        namespace="ml",
        name=name,
        node="node-a",
        phase="Running",
        start_time=START,
        gpu_requests=gpus,
        gpu_limits=gpus,
        container_ids={},
    )


def test_attribute_profiles_names_pods_by_uid() -> None:
    local = replace(gpu_profile("0", "training"), labels={POD_UID_LABEL: "uid-1"})
    unknown = replace(gpu_profile("1", "inference"), labels={POD_UID_LABEL: "uid-gone"})
    labelled = gpu_profile("2", "inference", namespace="serving", pod="api-0")
    result = attribute_profiles([local, unknown, labelled], [pod("trainer", "uid-1")])
    assert [(p.namespace, p.pod) for p in result] == [
        ("ml", "trainer"),
        (None, None),
        ("serving", "api-0"),
    ]


def test_pod_usage_takes_maxima_over_the_pods_gpus() -> None:
    profiles = [
        gpu_profile(
            "0", "training", util=(80, 70, 50, 0), fb_used_max=1000, namespace="ml", pod="t"
        ),
        gpu_profile(
            "1", "training", util=(95, 90, 60, 0), fb_used_max=500, namespace="ml", pod="t"
        ),
        gpu_profile("2", "idle"),
    ]
    profiles[1] = replace(
        profiles[1],
        stats={**profiles[1].stats, FB_USED: FieldStats(math.nan, math.nan, math.nan, 1)},
    )
    usage = pod_usage(
        profiles,
        [pod("t", "uid-t", gpus=2), pod("waiting", "uid-w"), pod("cpu-only", "uid-c", gpus=0)],
        {"uid-t": PodPeak(cpu_util_max=310.0, mem_used_max_bytes=5e9)},
        "node-a",
    )
    by_name = {u.pod: u for u in usage}
    assert set(by_name) == {"t", "waiting"}  # the CPU-only pod is not a GPU pod
    trainer = by_name["t"]
    assert trainer.gpus == ("0", "1")
    assert trainer.gpu_util_max == 95
    assert trainer.fb_used_max_mib == 1000  # NaN ignored
    assert trainer.cpu_util_max == 310.0
    assert trainer.mem_used_max_bytes == 5e9
    assert trainer.start_time == START
    assert trainer.node == "node-a"
    waiting = by_name["waiting"]
    assert waiting.gpus == ()
    assert waiting.gpu_util_max is None
    assert waiting.cpu_util_max is None


def test_pods_from_dcgm_labels_without_kubernetes() -> None:
    usage = pod_usage([gpu_profile("0", "inference", namespace="s", pod="api")], [], {}, "n")
    assert [(u.namespace, u.pod, u.gpus, u.start_time) for u in usage] == [
        ("s", "api", ("0",), None)
    ]
