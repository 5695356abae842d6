"""What KubernetesSink writes: the node's annotations for each GPU (and MIG instance), the GPU
pods' own, keys of earlier versions and of vanished GPUs removed, reasons cut to fit, and the
node's annotations bounded in count and size.

Against the stand-in API server (a test double, tests/support/apiserver/), over real HTTP,
through the real client; its node and pod: tests/support/annotated_node.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from profiler_app.core.errors import UserError
from profiler_app.core.kube import KubeConnection
from profiler_app.core.model import PodUsage
from profiler_app.sinks.kubernetes import (
    ANNOTATION_BUDGET_BYTES,
    MAX_GPUS,
    STRATEGIC_MERGE_PATCH,
    KubernetesSink,
    annotation_bytes,
    node_annotations,
)
from tests.support.annotated_node import (
    NODE,
    NODE_PATH,
    POD_PATH,
    D,
    node_with_trainer,
    on_node,
    published_baseline,
)
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer
from tests.support.cycles import AT, gpu_profile, mig_profile, sample_cycle


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with node_with_trainer() as server:
        yield server


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
