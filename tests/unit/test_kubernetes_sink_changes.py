"""When KubernetesSink writes: an unchanged cycle costs no request, a change one patch of the
changed keys (numbers only beyond a tolerance of the value last written), a heartbeat refreshes
the time and repairs hand edits, a restarted sink adopts what it finds, pods are patched only
when their values change.

Against the stand-in API server (a test double, tests/support/apiserver/), over real HTTP,
through the real client; its node and pod: tests/support/annotated_node.py. Time for heartbeats
is a fake clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from profiler_app.core.kube import KubeConnection
from profiler_app.core.model import CycleResult
from profiler_app.sinks.kubernetes import KubernetesSink, significant
from tests.support.annotated_node import (
    NODE,
    NODE_PATH,
    POD_PATH,
    D,
    at_offset,
    node_with_trainer,
    on_node,
    published_baseline,
)
from tests.support.apiserver.server import StandInApiServer
from tests.support.clock import FakeClock
from tests.support.cycles import gpu_profile, sample_cycle


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with node_with_trainer() as server:
        yield server


def test_confidence_and_reasons_change_only_with_new_evidence(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    """Numbers inside the reasons and small confidence moves cost nothing; other words do."""
    result = published_baseline(sink, apiserver)
    training = result.gpus[0]

    wobble = dataclasses.replace(
        training, confidence=0.93, reasons=("period 13s in util", "owner PyTorchJob")
    )
    clock.advance(30)
    sink.publish(at_offset(dataclasses.replace(result, gpus=[wobble, result.gpus[1]]), 30))
    assert apiserver.requests() == []

    news = dataclasses.replace(
        wobble, reasons=("period 13s in power", "no loop in util", "owner PyTorchJob")
    )
    clock.advance(30)
    sink.publish(at_offset(dataclasses.replace(result, gpus=[news, result.gpus[1]]), 60))
    (patch,) = apiserver.requests()
    annotations = patch.json()["metadata"]["annotations"]
    assert (
        annotations[f"{D}/gpu-0-reasons"]
        == "period 13s in power; no loop in util; owner PyTorchJob"
    )
    assert annotations[f"{D}/gpu-0-confidence"] == "0.93"  # brought along with the change


def test_unchanged_cycle_costs_zero_requests(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = published_baseline(sink, apiserver)

    # Noise below the rounding step, a newer timestamp and 5 minutes later: nothing to send.
    noisy = dataclasses.replace(
        result,
        gpus=[
            gpu_profile(
                "0",
                "training",
                period=12.52,
                util=(90.3, 85, 60, 0.1),
                mem_util_max=39.8,
                engine="torchrun",
                framework="pytorch",
            ),
            result.gpus[1],
        ],
    )
    clock.advance(300)
    sink.publish(at_offset(noisy, 300))

    assert apiserver.requests() == []


def test_change_sends_one_patch_with_only_the_changed_keys(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = published_baseline(sink, apiserver)

    changed = dataclasses.replace(
        result, gpus=[result.gpus[0], gpu_profile("1", "inference", util=(55, 50, 30, 0.2))]
    )
    clock.advance(30)
    sink.publish(at_offset(changed, 30))

    requests = apiserver.requests()
    assert [(r.method, r.path) for r in requests] == [("PATCH", NODE_PATH)]
    assert requests[0].json()["metadata"]["annotations"] == {
        f"{D}/gpu-1-job-type": "inference",
        f"{D}/gpu-1-util-max": "55",
        f"{D}/gpu-1-mem-copy-util-max": "40",
        f"{D}/gpu-1-fb-used-max-mib": "30000",
        f"{D}/gpu-1-confidence": "0.90",
        f"{D}/gpu-1-reasons": "util idle 0% of samples; no loop",
        f"{D}/profiled-at": "2026-11-22T04:00:30Z",
    }


def test_heartbeat_refreshes_profiled_at_alone(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = sample_cycle(NODE)
    sink.publish(result)
    clock.advance(599)
    sink.publish(at_offset(result, 599))
    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 1

    clock.advance(1)
    sink.publish(at_offset(result, 600))

    patches = apiserver.requests(method="PATCH", path=NODE_PATH)
    assert len(patches) == 2
    assert len(apiserver.requests(method="GET", path=NODE_PATH)) == 2  # start, heartbeat
    assert patches[1].json() == {
        "metadata": {"annotations": {f"{D}/profiled-at": "2026-11-22T04:10:00Z"}}
    }


def test_restart_adopts_existing_annotations_and_removes_leftovers(
    apiserver: StandInApiServer, connection: KubeConnection, sink: KubernetesSink
) -> None:
    sink.publish(sample_cycle(NODE))
    # A previous run knew a GPU 7 that this node no longer reports.
    apiserver.update_node(
        NODE, lambda node: node["metadata"]["annotations"].update({f"{D}/gpu-7-job-type": "idle"})
    )
    apiserver.clear_requests()

    restarted = KubernetesSink(connection, NODE, heartbeat_seconds=600)
    restarted.publish(sample_cycle(NODE))

    requests = apiserver.requests(path=NODE_PATH)
    assert [r.method for r in requests] == ["GET", "PATCH"]
    assert requests[1].json()["metadata"]["annotations"] == {
        f"{D}/gpu-7-job-type": None,
        f"{D}/profiled-at": "2026-11-22T04:00:00Z",
    }


def test_pod_patched_only_when_its_values_change(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    result = sample_cycle(NODE)
    sink.publish(result)
    sink.publish(result)
    assert len(apiserver.requests(method="PATCH", path=POD_PATH)) == 1

    busier = dataclasses.replace(result.pods[0], cpu_util_max=400.0)
    sink.publish(dataclasses.replace(result, pods=[busier]))

    patches = apiserver.requests(method="PATCH", path=POD_PATH)
    assert len(patches) == 2
    assert patches[1].json() == {"metadata": {"annotations": {f"{D}/cpu-util-max": "400"}}}


def test_heartbeat_repairs_annotations_edited_by_hand(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = sample_cycle(NODE)
    sink.publish(result)

    def edit(node: dict[str, Any]) -> None:
        del node["metadata"]["annotations"][f"{D}/gpu-0-job-type"]
        node["metadata"]["annotations"][f"{D}/gpu-1-util-max"] = "99"

    apiserver.update_node(NODE, edit)

    clock.advance(600)
    sink.publish(at_offset(result, 600))

    patch = apiserver.requests(method="PATCH", path=NODE_PATH)[-1].json()["metadata"]
    assert patch["annotations"] == {
        f"{D}/gpu-0-job-type": "training",
        f"{D}/gpu-1-util-max": "0",
        f"{D}/profiled-at": "2026-11-22T04:10:00Z",
    }
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


# -- tolerance: numbers count as changed only beyond a tolerance from the value last written --


def with_gpu0(
    result: CycleResult, *, period: float = 12.5, util: float = 90.0, fb: float = 30_000.0
) -> CycleResult:
    gpu0 = gpu_profile(
        "0",
        "training",
        period=period,
        util=(util, 85, 60, 0.1),
        fb_used_max=fb,
        engine="torchrun",
        framework="pytorch",
    )
    return dataclasses.replace(result, gpus=[gpu0, *result.gpus[1:]])


def run_cycles(
    sink: KubernetesSink, clock: FakeClock, results: list[CycleResult], step: float = 10.0
) -> None:
    for number, result in enumerate(results, start=1):
        clock.advance(step)
        sink.publish(at_offset(result, number * step))


def test_period_and_peaks_wobbling_within_tolerance_cost_zero_requests(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = published_baseline(sink, apiserver)

    # 50 cycles (under the heartbeat): the period estimate slides by up to 0.2 s (1.6 %),
    # peaks by a point, framebuffer by 60 MiB: each value would have been a PATCH before.
    periods = [12.4, 12.6, 12.7, 12.3, 12.5]
    wobbling = [
        with_gpu0(result, period=periods[i % 5], util=89 + i % 3, fb=30_000 + 60 * (i % 2))
        for i in range(50)
    ]
    run_cycles(sink, clock, wobbling)

    assert apiserver.requests() == []
    assert on_node(apiserver)[f"{D}/gpu-0-period-seconds"] == "12.5"


def test_real_change_costs_exactly_one_patch_and_brings_small_changes_along(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = published_baseline(sink, apiserver)

    # The period jumps to 15 s, then wobbles around it for 20 cycles.
    changed = [with_gpu0(result, period=15.0, util=91)] + [
        with_gpu0(result, period=15.0 + (0.1 if i % 2 else -0.1)) for i in range(20)
    ]
    run_cycles(sink, clock, changed)

    (patch,) = apiserver.requests()
    assert (patch.method, patch.path) == ("PATCH", NODE_PATH)
    # The 1-point util move rides along with the real change: the node shows current values.
    assert patch.json()["metadata"]["annotations"] == {
        f"{D}/gpu-0-period-seconds": "15.0",
        f"{D}/gpu-0-util-max": "91",
        f"{D}/profiled-at": "2026-11-22T04:00:10Z",
    }


def test_drift_is_written_once_it_exceeds_the_tolerance_from_the_value_written(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = published_baseline(sink, apiserver)

    # 0.1 s per cycle is always within 2 % of the previous cycle, but 12.8 is 2.4 % from 12.5.
    run_cycles(sink, clock, [with_gpu0(result, period=p) for p in (12.6, 12.7, 12.8)])

    patches = apiserver.requests(method="PATCH", path=NODE_PATH)
    assert len(patches) == 1
    assert patches[0].json()["metadata"]["annotations"][f"{D}/gpu-0-period-seconds"] == "12.8"

    # The reference is now 12.8: 13.0 (1.6 %) waits, 13.1 (2.3 %) is written.
    run_cycles(sink, clock, [with_gpu0(result, period=p) for p in (12.9, 13.0, 13.1)])
    patches = apiserver.requests(method="PATCH", path=NODE_PATH)
    assert len(patches) == 2
    assert on_node(apiserver)[f"{D}/gpu-0-period-seconds"] == "13.1"


def test_job_type_change_is_written_even_with_equal_numbers(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = published_baseline(sink, apiserver)

    bursty = gpu_profile(
        "1",
        "bursty",
        util=(0.0, 0.0, 0.0, 1.0),
        mem_util_max=0,
        fb_used_max=0,
        confidence=0.95,
        reasons=result.gpus[1].reasons,
    )
    run_cycles(sink, clock, [dataclasses.replace(result, gpus=[result.gpus[0], bursty])])

    (patch,) = apiserver.requests()
    assert patch.json()["metadata"]["annotations"] == {
        f"{D}/gpu-1-job-type": "bursty",
        f"{D}/profiled-at": "2026-11-22T04:00:10Z",
    }


def test_pod_values_within_tolerance_are_not_patched(
    apiserver: StandInApiServer, sink: KubernetesSink, clock: FakeClock
) -> None:
    result = sample_cycle(NODE)
    sink.publish(result)
    pod = result.pods[0]

    within = dataclasses.replace(
        pod, gpu_util_max=91.0, cpu_util_max=254.0, mem_used_max_bytes=(8192 + 60) * 2**20
    )
    beyond = dataclasses.replace(within, cpu_util_max=256.0)  # 2.4 % of 250
    run_cycles(
        sink, clock, [dataclasses.replace(result, pods=[p]) for p in (within, within, beyond)]
    )

    patches = apiserver.requests(method="PATCH", path=POD_PATH)
    assert len(patches) == 2  # the first cycle's, and the one beyond tolerance
    assert patches[1].json()["metadata"]["annotations"] == {
        f"{D}/gpu-util-max": "91",
        f"{D}/cpu-util-max": "256",
        f"{D}/mem-used-max-mib": "8252",
    }


@pytest.mark.parametrize(
    ("key", "written", "current", "expected"),
    [
        (f"{D}/gpu-0-period-seconds", "12.5", "12.7", False),  # 1.6 %
        (f"{D}/gpu-0-period-seconds", "12.5", "12.8", True),  # 2.4 %
        (f"{D}/gpu-0-period-seconds", "1.0", "1.1", True),  # the 0.1 s resolution of short periods
        (f"{D}/gpu-0-period-seconds", "12.5", None, True),  # no longer training
        (f"{D}/gpu-0-period-seconds", None, "12.5", True),
        (f"{D}/gpu-0-util-max", "99", "100", False),
        (f"{D}/gpu-0-util-max", "97", "99", True),
        (f"{D}/gpu-12-mem-copy-util-max", "40", "41", False),
        (f"{D}/gpu-12-mem-copy-util-max", "40", "38", True),
        (f"{D}/gpu-0-fb-used-max-mib", "0", "64", False),
        (f"{D}/gpu-0-fb-used-max-mib", "0", "65", True),
        (f"{D}/gpu-0-fb-used-max-mib", "40000", "40400", False),  # 1 % of 40000 is 400
        (f"{D}/gpu-0-fb-used-max-mib", "40000", "40401", True),
        (f"{D}/gpu-0-job-type", "training", "inference", True),
        (f"{D}/gpu-util-max", "90", "91", False),
        (f"{D}/cpu-util-max", "1000", "1020", False),
        (f"{D}/cpu-util-max", "1000", "1021", True),
        (f"{D}/mem-used-max-mib", "8192", "8256", False),
        (f"{D}/mem-used-max-mib", "8192", "8300", True),
        (f"{D}/profiled-at", "2026-11-22T04:00:00Z", "2026-11-22T04:00:30Z", True),
        (f"{D}/gpu-0-util-max", "90", "garbage", True),
    ],
)
def test_significance_by_key(
    key: str, written: str | None, current: str | None, expected: bool
) -> None:
    assert significant(key, written, current) is expected
    assert significant(key, written, written) is False
