"""Opt-in (``--scaling``): GPU nodes come when a pod needs a GPU, and go when none does.

On a cluster scaled to zero GPU nodes, a pod requesting one GPU waits until Karpenter launches a
NodeClaim, its node joins, the device plugin registers the GPU and the pod runs there; once the
pod is deleted, the empty node goes away after the NodePool's consolidation delay. It takes
minutes on a real cluster and needs no GPU node at the start, so it runs only when asked for,
on its own: ``pytest tests/smoke/checks/test_scaling.py --kubeconfig K --scaling``.
"""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, SmokeError, eventually, fail_on
from tests.smoke.checks.layout import SmokeSettings
from tests.smoke.checks.pods import HOLD_SECONDS, cuda_pod_manifest, run_pod
from tests.smoke.checks.scaling import (
    claim_of,
    gpu_nodes_present,
    node_claims,
    still_there,
    why_no_node,
)
from tests.smoke.checks.scheduling import name

pytestmark = pytest.mark.smoke
SKIP_REASON = (
    "the scaling check runs only with --scaling, on a cluster scaled to zero GPU nodes "
    "(tests/smoke/README.md)"
)


def test_a_gpu_pod_brings_a_gpu_node_that_goes_away_when_empty(
    cluster: Cluster, settings: SmokeSettings, smoke_namespace: str
) -> None:
    if not settings.scaling:
        pytest.skip(SKIP_REASON)
    try:
        claims_before = {name(claim) for claim in node_claims(cluster)}
    except SmokeError as error:
        problem = str(error)
    else:
        problem = ""
    fail_on([problem] if problem else [], "Karpenter is not installed")
    fail_on(
        eventually(lambda: gpu_nodes_present(cluster), settings.scale_down_timeout_seconds),
        "The cluster is not scaled to zero GPU nodes",
    )

    arguments = ["--expect-devices", "1", "--hold", str(HOLD_SECONDS)]
    manifest = cuda_pod_manifest("gpu-smoke-scale-up", settings.image, arguments, gpus=1)
    run = run_pod(
        cluster,
        smoke_namespace,
        manifest,
        keep_running=True,
        timeout=settings.scale_up_timeout_seconds,
    )
    try:
        if run.problem or run.node is None:
            reason = why_no_node(cluster, run, claims_before, settings.scale_up_timeout_seconds)
            fail_on([reason], "A pod requesting a GPU got no GPU node")
        node = str(run.node)
        claim = claim_of(cluster, node)
        if claim is None:
            fail_on(
                [
                    f"{run.describe()} runs on node {node}, which no NodeClaim launched: a "
                    "managed node group or another autoscaler added it, so Karpenter's scaling "
                    "is not what this run shows; scale that group to 0"
                ],
                "A pod requesting a GPU got a node Karpenter did not launch",
            )
        assert claim is not None  # fail_on ended the check otherwise
    finally:
        cluster.delete(f"/api/v1/namespaces/{smoke_namespace}/pods/{run.name}")

    timeout = settings.scale_down_timeout_seconds
    fail_on(
        eventually(lambda: still_there(cluster, node, name(claim), timeout), timeout),
        "The empty GPU node did not go away",
    )
