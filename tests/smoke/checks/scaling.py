"""Readings for the scaling check (test_scaling.py): Karpenter's NodeClaims, the GPU nodes they
launch, and, when something does not happen, what the cluster says about why."""

from __future__ import annotations

from tests.smoke.checks.cluster import ApiError, Cluster, SmokeError
from tests.smoke.checks.layout import GPU_RESOURCE, NODE_CLAIMS_PATH
from tests.smoke.checks.pods import PodRun
from tests.smoke.checks.scheduling import Json, annotations, gpu_nodes, name

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ACTIVE_PHASES = ("Pending", "Running")


def node_claims(cluster: Cluster) -> list[Json]:
    """Every NodeClaim; SmokeError naming the fix when the cluster serves none (no Karpenter)."""
    try:
        return cluster.list(NODE_CLAIMS_PATH)
    except ApiError as error:
        if error.status != 404:
            raise
        raise SmokeError(
            f"the cluster serves no karpenter.sh/v1 NodeClaims ({error}): install Karpenter "
            "(the EKS stack's Karpenter setting), or run without --scaling"
        ) from None


def claim_node(claim: Json) -> str | None:
    return (claim.get("status") or {}).get("nodeName") or None


def unmet_conditions(claim: Json) -> str:
    """``Launched=Unknown (Reason: message)`` for each condition that is not True."""
    unmet = [
        f"{condition.get('type')}={condition.get('status')}"
        + (
            f" ({condition.get('reason')}: {condition.get('message')})"
            if condition.get("reason")
            else ""
        )
        for condition in (claim.get("status") or {}).get("conditions") or []
        if condition.get("status") != "True"
    ]
    return "; ".join(unmet) or "no conditions reported"


def gpu_nodes_present(cluster: Cluster) -> list[str]:
    """One problem per GPU node: the check starts from a cluster scaled to zero of them."""
    return [
        f"GPU node {name(node)} is up: the scaling check starts from zero GPU nodes; stop the "
        "GPU pods that keep it (run test_scaling.py on its own, not with the rest of the suite) "
        "and give any managed GPU node group a desired size of 0"
        for node in gpu_nodes(cluster)
    ]


def why_no_node(cluster: Cluster, run: PodRun, claims_before: set[str], timeout: float) -> str:
    """Why the pod got no GPU node within ``timeout``: no NodeClaim, one that did not launch,
    or a node that joined but cannot take the pod."""
    pod = f"{run.describe()}: {run.problem}"
    new = [claim for claim in node_claims(cluster) if name(claim) not in claims_before]
    if not new:
        return (
            f"no NodeClaim was created in {timeout:.0f}s for {pod}: Karpenter did not act on the "
            "pending pod: check that its controller runs and what it logs, and that a NodePool "
            "admits the pod (nodes labelled nvidia.com/gpu.present=true and tainted "
            f"nvidia.com/gpu=present:NoSchedule, its {GPU_RESOURCE} limit not reached: "
            "`kubectl get nodepools`)"
        )
    reasons = []
    for claim in new:
        node = claim_node(claim)
        if node is None:
            reasons.append(
                f"NodeClaim {name(claim)} has no node after {timeout:.0f}s "
                f"({unmet_conditions(claim)}): Karpenter could not launch an instance: check the "
                "EC2NodeClass (AMI family, subnets, security groups, node role) and that the "
                "NodePool's instance types and capacity types have capacity "
                f"(`kubectl describe nodeclaim {name(claim)}`)"
            )
        else:
            reasons.append(
                f"node {node} of NodeClaim {name(claim)} joined ({unmet_conditions(claim)}), "
                f"but {pod}: with Insufficient "
                f"{GPU_RESOURCE}, the device plugin has not registered GPUs there (its DaemonSet "
                "must tolerate the NodePool's taint and select its label)"
            )
    return "; ".join(reasons)


def claim_of(cluster: Cluster, node: str) -> Json | None:
    """The NodeClaim that launched ``node``, if one did."""
    return next((claim for claim in node_claims(cluster) if claim_node(claim) == node), None)


def _pods_keeping(cluster: Cluster, node: str) -> list[str]:
    """The pods on ``node`` that are not a DaemonSet's and still run or wait there."""
    kept = []
    for pod in cluster.list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}):
        owners = pod["metadata"].get("ownerReferences") or []
        phase = (pod.get("status") or {}).get("phase")
        if phase not in ACTIVE_PHASES or any(o.get("kind") == "DaemonSet" for o in owners):
            continue
        protected = annotations(pod).get(DO_NOT_DISRUPT) == "true"
        kept.append(
            f"{pod['metadata'].get('namespace')}/{name(pod)}"
            + (f" ({DO_NOT_DISRUPT})" if protected else "")
        )
    return kept


def still_there(cluster: Cluster, node: str, claim: str, timeout: float) -> list[str]:
    """One problem if ``node`` or its NodeClaim still exists, saying what may keep it."""
    node_left = cluster.get_or_none(f"/api/v1/nodes/{node}") is not None
    claim_left = cluster.get_or_none(f"{NODE_CLAIMS_PATH}/{claim}") is not None
    if not (node_left or claim_left):
        return []
    what = " and ".join(
        part
        for part, left in ((f"node {node}", node_left), (f"NodeClaim {claim}", claim_left))
        if left
    )
    pods = _pods_keeping(cluster, node) if node_left else []
    kept = f" (pods still on it: {', '.join(pods)})" if pods else ""
    return [
        f"{what} still there {timeout:.0f}s after its GPU pod was deleted{kept}: Karpenter did "
        "not consolidate the empty node: check the GPU NodePool's disruption (consolidationPolicy "
        "WhenEmpty or WhenEmptyOrUnderutilized, consolidateAfter shorter than "
        "--scale-down-timeout, budgets that allow it) and "
        f"`kubectl describe nodeclaim {claim}`"
    ]
