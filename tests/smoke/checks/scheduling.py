"""GPU nodes, and why a pod does or does not run on a node: readings of Node and Pod objects.

A node counts as a GPU node when anything marks it as one: the GPU label, the GPU taint, or
``nvidia.com/gpu`` capacity. The checks then demand all three, so a node missing one is named
rather than silently left out.
"""

from __future__ import annotations

from typing import Any

from tests.smoke.checks.cluster import Cluster
from tests.smoke.checks.layout import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    INSTANCE_TYPE_LABEL,
    NVSWITCH_INSTANCE_TYPES,
    SmokeSettings,
)

Json = dict[str, Any]
# The DaemonSet controller adds tolerations for these node conditions to every DaemonSet pod.
DAEMON_SET_TOLERATED_PREFIX = "node.kubernetes.io/"
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


def name(obj: Json) -> str:
    return str(obj["metadata"]["name"])


def labels(obj: Json) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def annotations(obj: Json) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


def taints(node: Json) -> list[Json]:
    return list(node.get("spec", {}).get("taints") or [])


def describe_taint(taint: Json) -> str:
    value = taint.get("value")
    return f"{taint['key']}{'=' + value if value else ''}:{taint.get('effect', '')}"


def gpu_count(node: Json, field: str) -> int | None:
    """``status.capacity`` or ``status.allocatable`` of nvidia.com/gpu; None when absent."""
    value = (node.get("status", {}).get(field) or {}).get(GPU_RESOURCE)
    return None if value is None else int(value)


def has_gpu_label(node: Json) -> bool:
    return labels(node).get(GPU_NODE_LABEL_KEY) == GPU_NODE_LABEL_VALUE


def has_gpu_taint(node: Json) -> bool:
    return any(
        taint.get("key") == GPU_TAINT_KEY
        and taint.get("value") == GPU_TAINT_VALUE
        and taint.get("effect") == GPU_TAINT_EFFECT
        for taint in taints(node)
    )


def is_gpu_node(node: Json) -> bool:
    return (
        has_gpu_label(node)
        or any(taint.get("key") == GPU_TAINT_KEY for taint in taints(node))
        or bool(gpu_count(node, "capacity"))
    )


def is_nvswitch_node(node: Json, settings: SmokeSettings) -> bool:
    """A node whose GPUs hang off NVSwitches: an HGX instance type, or named on the command line."""
    return (
        labels(node).get(INSTANCE_TYPE_LABEL) in NVSWITCH_INSTANCE_TYPES
        or name(node) in settings.nvswitch_nodes
    )


def gpu_nodes(cluster: Cluster) -> list[Json]:
    return [node for node in cluster.list("/api/v1/nodes") if is_gpu_node(node)]


def ready_condition(obj: Json) -> Json | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return dict(condition)
    return None


def is_ready(obj: Json) -> bool:
    condition = ready_condition(obj)
    return condition is not None and condition.get("status") == "True"


def _toleration_matches(toleration: Json, taint: Json) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if not toleration.get("key"):  # an empty key with Exists tolerates every taint
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


def untolerated_taints(
    node: Json, tolerations: list[Json], *, daemon_set: bool = False
) -> list[Json]:
    """The node's scheduling taints that none of ``tolerations`` tolerates."""
    return [
        taint
        for taint in taints(node)
        if taint.get("effect") in SCHEDULING_EFFECTS
        and not (daemon_set and str(taint.get("key", "")).startswith(DAEMON_SET_TOLERATED_PREFIX))
        and not any(_toleration_matches(toleration, taint) for toleration in tolerations)
    ]


def selector_mismatches(node: Json, node_selector: dict[str, str]) -> list[str]:
    """``key=value`` pairs of a nodeSelector that the node's labels do not satisfy."""
    node_labels = labels(node)
    return [
        f"{key}={value}" for key, value in node_selector.items() if node_labels.get(key) != value
    ]


def why_not_running(pod: Json) -> str:
    """What keeps a pod from running and ready, from its status, as the scheduler and the kubelet
    reported it."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"not scheduled: {condition.get('message') or condition.get('reason')}"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if "waiting" in state:
            waiting = state["waiting"]
            detail = f" ({waiting['message']})" if waiting.get("message") else ""
            return f"container {container['name']} waiting: {waiting.get('reason')}{detail}"
        if "terminated" in state:
            ended = state["terminated"]
            return (
                f"container {container['name']} terminated: {ended.get('reason')}"
                f" (exit code {ended.get('exitCode')})"
            )
        if not container.get("ready"):
            return f"container {container['name']} running but not ready (failing readiness probe?)"
    return f"phase {status.get('phase', 'unknown')}"


def _expression_holds(node_labels: dict[str, str], expression: Json) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator")
    values = expression.get("values") or []
    if operator == "In":
        return node_labels.get(key) in values
    if operator == "NotIn":
        return node_labels.get(key) not in values
    if operator == "Exists":
        return key in node_labels
    if operator == "DoesNotExist":
        return key not in node_labels
    return True  # Gt/Lt: not used by the GPU layer; do not guess


def _describe_expression(expression: Json) -> str:
    values = expression.get("values")
    return f"{expression.get('key')} {expression.get('operator')} {values or ''}".rstrip()


def affinity_mismatch(node: Json, affinity: Json | None) -> str | None:
    """Why the node fails the required node affinity (terms ORed, expressions ANDed), if it does."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    node_labels = labels(node)
    if not terms or any(
        all(
            _expression_holds(node_labels, expression)
            for expression in term.get("matchExpressions") or []
        )
        for term in terms
    ):
        return None
    wanted = " or ".join(
        " and ".join(
            _describe_expression(expression) for expression in term.get("matchExpressions") or []
        )
        for term in terms
    )
    return f"its labels do not satisfy the required node affinity ({wanted})"


def why_not_placed(node: Json, pod_spec: Json, *, daemon_set: bool) -> list[str]:
    """Why a pod with ``pod_spec`` cannot be placed on ``node``: taints, selector, affinity."""
    reasons = [
        f"taint {describe_taint(taint)} is not tolerated (remove it from the node, or add a "
        "toleration)"
        for taint in untolerated_taints(
            node, pod_spec.get("tolerations") or [], daemon_set=daemon_set
        )
    ]
    missing = selector_mismatches(node, pod_spec.get("nodeSelector") or {})
    if missing:
        reasons.append(f"it lacks the label(s) {', '.join(missing)} of the nodeSelector")
    affinity = affinity_mismatch(node, pod_spec.get("affinity"))
    if affinity:
        reasons.append(affinity)
    return reasons
