"""KubernetesSink against the stand-in API server, over real HTTP, through the real client.

The API server is a test double (tests/support/apiserver/): no kube-apiserver can run here.
Time for heartbeats and back-off is a fake clock; request timeouts are real but short.
"""

from __future__ import annotations

import dataclasses
import http.server
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from profiler_app.errors import UserError
from profiler_app.kube import KubeConnection, KubernetesError, connect
from profiler_app.model import CycleResult, PodUsage
from profiler_app.sinks.kubernetes import (
    ANNOTATION_BUDGET_BYTES,
    MAX_GPUS,
    STRATEGIC_MERGE_PATCH,
    KubernetesSink,
    annotation_bytes,
    node_annotations,
    significant,
)
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.clock import FakeClock
from tests.support.cycles import AT, gpu_profile, mig_profile, sample_cycle

D = "ai.centaurus.io"
NODE = "node-a"
NODE_PATH = f"/api/v1/nodes/{NODE}"
POD_PATH = "/api/v1/namespaces/ml/pods/trainer-0"


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node(NODE, annotations={"foreign.example.com/keep": "me"})
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=AT))
        yield server


@pytest.fixture
def sink(connection: KubeConnection, clock: FakeClock) -> KubernetesSink:
    return KubernetesSink(connection, NODE, heartbeat_seconds=600, clock=clock)


def at_offset(result: CycleResult, seconds: float) -> CycleResult:
    return dataclasses.replace(result, at=result.at + timedelta(seconds=seconds))


def published_baseline(sink: KubernetesSink, apiserver: StandInApiServer) -> CycleResult:
    """The sample cycle, published; the requests it cost are cleared."""
    result = sample_cycle(NODE)
    sink.publish(result)
    apiserver.clear_requests()
    return result


def on_node(apiserver: StandInApiServer) -> dict[str, str]:
    return dict(apiserver.node(NODE)["metadata"]["annotations"])


def test_first_cycle_reads_node_once_and_writes_one_strategic_merge_patch(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.clear_requests()
    sink.publish(sample_cycle(NODE))

    node_requests = apiserver.requests(path=NODE_PATH)
    assert [r.method for r in node_requests] == ["GET", "PATCH"]
    patch = node_requests[1]
    assert patch.content_type == STRATEGIC_MERGE_PATCH
    assert set(patch.json()) == {"metadata"}
    written = on_node(apiserver)
    assert written == {
        "foreign.example.com/keep": "me",
        f"{D}/profiled-at": "2026-11-22T04:00:00Z",
        f"{D}/gpu-0-job-type": "training",
        f"{D}/gpu-0-period-seconds": "12.5",
        f"{D}/gpu-0-util-max": "90",
        f"{D}/gpu-0-mem-copy-util-max": "40",
        f"{D}/gpu-0-fb-used-max-mib": "30000",
        f"{D}/gpu-0-confidence": "0.90",
        f"{D}/gpu-0-reasons": "period 12s in util; owner PyTorchJob",
        f"{D}/gpu-0-engine": "torchrun",
        f"{D}/gpu-0-framework": "pytorch",
        f"{D}/gpu-1-job-type": "idle",
        f"{D}/gpu-1-util-max": "0",
        f"{D}/gpu-1-mem-copy-util-max": "0",
        f"{D}/gpu-1-fb-used-max-mib": "0",
        f"{D}/gpu-1-confidence": "0.95",
        f"{D}/gpu-1-reasons": "util idle 100% of samples",
    }


def test_pod_annotations_written_for_gpu_pods_only(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.add_pod(pod_manifest("web", "frontend", NODE))
    result = sample_cycle(NODE)
    cpu_only = PodUsage("web", "frontend", NODE, AT, gpus=(), cpu_util_max=50.0)
    sink.publish(dataclasses.replace(result, pods=[*result.pods, cpu_only]))

    pod = apiserver.pod("ml", "trainer-0")["metadata"]["annotations"]
    assert pod == {
        f"{D}/gpu-util-max": "90",
        f"{D}/gpu-mem-copy-util-max": "40",
        f"{D}/cpu-util-max": "250",
        f"{D}/mem-used-max-mib": "8192",
    }
    assert apiserver.requests(path="/api/v1/namespaces/web/pods/frontend") == []
    assert apiserver.requests(method="PATCH", path=POD_PATH)[0].content_type == (
        STRATEGIC_MERGE_PATCH
    )


def test_memory_copy_keys_of_earlier_versions_are_removed(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    """``mem-util-max`` was renamed ``mem-copy-util-max`` (it is memory bandwidth, not
    occupancy): the old keys go with the first write, so no object shows both."""
    apiserver.add_node(
        NODE, annotations={f"{D}/gpu-0-mem-util-max": "40", "foreign.example.com/keep": "me"}
    )
    manifest = pod_manifest("ml", "trainer-0", NODE, gpus=1, start_time=AT)
    manifest["metadata"]["annotations"] = {f"{D}/gpu-mem-util-max": "40"}
    apiserver.add_pod(manifest)

    sink.publish(sample_cycle(NODE))

    node = on_node(apiserver)
    assert f"{D}/gpu-0-mem-util-max" not in node
    assert node[f"{D}/gpu-0-mem-copy-util-max"] == "40"
    pod = apiserver.pod("ml", "trainer-0")["metadata"]["annotations"]
    assert f"{D}/gpu-mem-util-max" not in pod
    assert pod[f"{D}/gpu-mem-copy-util-max"] == "40"


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


def test_reasons_are_cut_at_a_reason_and_left_out_beyond_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wordy = tuple(f"reason number {n} with some words" for n in range(20))
    result = dataclasses.replace(
        sample_cycle(NODE), gpus=[gpu_profile("0", "training", reasons=wordy)]
    )
    reasons = node_annotations(result, D)[f"{D}/gpu-0-reasons"]
    assert len(reasons) <= 160
    assert reasons.endswith("with some words")
    many = dataclasses.replace(
        result,
        gpus=[gpu_profile(str(n), "training", reasons=wordy) for n in range(MAX_GPUS)],
    )
    assert any(key.endswith("-reasons") for key in node_annotations(many, D))
    # With a long annotation domain, 64 GPUs' reasons would take the node past the budget.
    long_domain = "gpu-profiler.platform-team.example.internal.corp.example.com"
    annotations = node_annotations(many, long_domain)
    assert annotation_bytes(annotations) <= ANNOTATION_BUDGET_BYTES
    assert not any(key.endswith("-reasons") for key in annotations)
    assert f"{long_domain}/gpu-63-confidence" in annotations
    assert "leaving out the GPUs' reasons" in caplog.text


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


def test_keys_of_vanished_gpus_and_stale_period_are_removed_with_null(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    result = published_baseline(sink, apiserver)

    # GPU 1 gone; GPU 0 no longer training, so its period must go too, and nothing is known of
    # what runs on it any more.
    sink.publish(dataclasses.replace(result, gpus=[gpu_profile("0", "bursty")]))

    patch = apiserver.requests(method="PATCH", path=NODE_PATH)[0].json()["metadata"]
    removed = {key for key, value in patch["annotations"].items() if value is None}
    assert removed == {
        f"{D}/gpu-0-period-seconds",
        f"{D}/gpu-0-engine",
        f"{D}/gpu-0-framework",
        f"{D}/gpu-1-job-type",
        f"{D}/gpu-1-util-max",
        f"{D}/gpu-1-mem-copy-util-max",
        f"{D}/gpu-1-fb-used-max-mib",
        f"{D}/gpu-1-confidence",
        f"{D}/gpu-1-reasons",
    }
    written = on_node(apiserver)
    assert not any(key.startswith(f"{D}/gpu-1-") for key in written)
    assert written[f"{D}/gpu-0-job-type"] == "bursty"
    assert written["foreign.example.com/keep"] == "me"


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


def test_deleted_pod_is_logged_once_and_not_retried(
    apiserver: StandInApiServer, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.delete_pod("ml", "trainer-0")
    caplog.set_level(logging.INFO, logger="profiler_app")

    result = sample_cycle(NODE)
    sink.publish(result)
    sink.publish(
        dataclasses.replace(result, pods=[dataclasses.replace(result.pods[0], cpu_util_max=1)])
    )

    assert len(apiserver.requests(method="PATCH", path=POD_PATH)) == 1
    assert caplog.text.count("trainer-0 is gone") == 1
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_missing_node_raises_and_is_logged_once(
    apiserver: StandInApiServer, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.remove_node(NODE)
    caplog.set_level(logging.WARNING, logger="profiler_app")

    for _ in range(2):
        with pytest.raises(KubernetesError, match=f"node {NODE} not found"):
            sink.publish(sample_cycle(NODE))

    assert caplog.text.count("check --node") == 1
    apiserver.add_node(NODE)
    sink.publish(sample_cycle(NODE))
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_conflict_is_retried(apiserver: StandInApiServer, sink: KubernetesSink) -> None:
    apiserver.fail("PATCH", NODE_PATH, 409, times=2)

    sink.publish(sample_cycle(NODE))

    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 3
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_persistent_conflict_raises_after_retries(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.fail("PATCH", NODE_PATH, 409)

    with pytest.raises(KubernetesError, match="409"):
        sink.publish(sample_cycle(NODE))

    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 3


def test_too_many_requests_carries_retry_after_to_the_daemon(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    """The sink has no back-off of its own: it says what failed and what the server asked for;
    the daemon waits (profiler_app.backoff)."""
    apiserver.fail("PATCH", NODE_PATH, 429, times=1, retry_after=45)
    result = sample_cycle(NODE)

    with pytest.raises(KubernetesError, match=r"HTTP 429.*Retry-After 45s") as raised:
        sink.publish(result)
    assert raised.value.retry_after == 45

    sink.publish(result)  # called again, it tries again
    assert [r.method for r in apiserver.requests()][-2:] == ["PATCH", "PATCH"]  # node, then pod
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_server_errors_raise_without_retry_after_and_the_next_call_recovers(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.fail("PATCH", NODE_PATH, 500, times=1)
    result = sample_cycle(NODE)

    with pytest.raises(KubernetesError, match=r"HTTP 500") as raised:
        sink.publish(result)
    assert raised.value.retry_after is None
    sink.publish(result)
    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 2
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"
    apiserver.fail("PATCH", POD_PATH, 503, times=1)
    with pytest.raises(KubernetesError, match=r"HTTP 503"):
        sink.publish(
            dataclasses.replace(result, pods=[dataclasses.replace(result.pods[0], cpu_util_max=1)])
        )


def test_hung_server_times_out_and_recovers(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.hang("PATCH", NODE_PATH, seconds=8, times=1)
    result = sample_cycle(NODE)

    started = time.monotonic()
    with pytest.raises(KubernetesError, match=r"ReadTimeoutError|timed out"):
        sink.publish(result)
    assert time.monotonic() - started < 5  # the 0.5 s read timeout, not the 8 s hang

    sink.publish(result)
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_annotation_count_and_size_stay_bounded(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    many = [gpu_profile(str(i), "training", period=1234.5) for i in range(200)]
    result = dataclasses.replace(sample_cycle(NODE), gpus=many, pods=[])

    desired = node_annotations(result, D)
    sink.publish(result)

    gpus = {key.split("/")[1].split("-")[1] for key in on_node(apiserver) if "/gpu-" in key}
    assert len(gpus) == MAX_GPUS
    assert gpus == {str(i) for i in range(MAX_GPUS)}
    assert annotation_bytes(desired) <= ANNOTATION_BUDGET_BYTES


def test_invalid_domain_is_rejected(
    connection: KubeConnection,
) -> None:
    with pytest.raises(UserError, match="invalid annotation domain"):
        KubernetesSink(connection, NODE, domain="Not_A_Domain")


def test_token_is_sent_but_never_logged(
    apiserver: StandInApiServer, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    # Each logger explicitly: the CLI quiets the clients' loggers for the rest of the process.
    for name in (None, "kubernetes", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=name)
    apiserver.fail("PATCH", NODE_PATH, 500, times=1)

    with pytest.raises(KubernetesError) as raised:
        sink.publish(sample_cycle(NODE))

    assert all(r.authorization == f"Bearer {apiserver.token}" for r in apiserver.requests())
    assert caplog.records  # debug logging really was captured
    assert apiserver.token not in caplog.text
    assert apiserver.token not in str(raised.value)


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


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    """What a misconfigured proxy in front of the API server might answer: 200 with HTML."""

    def do_GET(self) -> None:
        body = b"<html>login</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def test_non_json_answer_is_a_kubernetes_error(tmp_path: Path, clock: FakeClock) -> None:
    """A stand-in HTTP server (test double) answering HTML instead of a Node object."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with running_apiserver() as apiserver:
            kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        kubeconfig.write_text(kubeconfig.read_text().replace(apiserver.url, url))
        made = connect(str(kubeconfig), request_timeout=(1.0, 1.0))
        assert made is not None
        sink = KubernetesSink(made, NODE, clock=clock)
        with pytest.raises(KubernetesError, match="not a JSON object"):
            sink.publish(sample_cycle(NODE))
        made.close()
    finally:
        server.shutdown()
        server.server_close()


def test_mig_instances_are_annotated_each_under_their_own_keys(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    """Seven instances of GPU 0 (MIG): seven sets of gpu-0-mig-<id>- keys with the instance's
    profile and its GR_ENGINE_ACTIVE in percent as util-max; an instance gone is removed."""
    result = sample_cycle(NODE)
    instances = [mig_profile("0", str(gi), "inference", util=gi / 10) for gi in range(1, 8)]
    sink.publish(dataclasses.replace(result, gpus=instances))
    written = on_node(apiserver)
    for gi in range(1, 8):
        prefix = f"{D}/gpu-0-mig-{gi}-"
        assert written[prefix + "job-type"] == "inference"
        assert written[prefix + "profile"] == "1g.10gb"
        assert written[prefix + "util-max"] == str(gi * 10)
        assert written[prefix + "mem-copy-util-max"] == str(gi * 5)
        assert written[prefix + "fb-used-max-mib"] == "4096"
    assert not any(key.startswith(f"{D}/gpu-0-job-type") for key in written)

    apiserver.clear_requests()
    sink.publish(dataclasses.replace(result, gpus=instances[:6]))
    patch = apiserver.requests(method="PATCH", path=NODE_PATH)[0].json()["metadata"]
    removed = {key for key, value in patch["annotations"].items() if value is None}
    assert removed
    assert all(key.startswith(f"{D}/gpu-0-mig-7-") for key in removed)
    assert not any(key.startswith(f"{D}/gpu-0-mig-7-") for key in on_node(apiserver))
