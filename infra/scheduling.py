"""Where a pod can run: node pools, and the scheduler's taint, node-selector and affinity rules.

A node pool is a set of identical nodes a stack declares (an EKS node group, a kubeadm host). The
rules here are the Kubernetes scheduler's filters that depend only on node labels and taints:
taints with effect NoSchedule or NoExecute must be tolerated, ``nodeSelector`` must match, and one
of the required node-affinity terms must match. Resource fit, pod (anti-)affinity and topology
spread are not modelled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.gpu import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
)

CONTROL_PLANE_ROLE = "node-role.kubernetes.io/control-plane"
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


GPU_TAINT = Taint(key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE, effect=GPU_TAINT_EFFECT)
CONTROL_PLANE_TAINT = Taint(key=CONTROL_PLANE_ROLE, effect="NoSchedule")


@dataclass(frozen=True)
class NodePool:
    """Nodes that share labels and taints; ``size`` nodes are expected to be up after deploy."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    size: int = 1
    # Nodes are launched when pods need them (a Karpenter NodePool), whatever ``size`` says.
    provisioned: bool = False

    @property
    def has_nodes(self) -> bool:
        return self.size > 0 or self.provisioned

    @property
    def is_gpu(self) -> bool:
        return self.labels.get(GPU_NODE_LABEL_KEY) == GPU_NODE_LABEL_VALUE


@dataclass(frozen=True)
class PodPlacement:
    """The parts of a pod spec that decide which nodes it may run on."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, pod_spec: Mapping[str, Any]) -> PodPlacement:
        return cls(
            node_selector=pod_spec.get("nodeSelector") or {},
            tolerations=pod_spec.get("tolerations") or (),
            affinity=pod_spec.get("affinity") or {},
        )


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """Whether one toleration tolerates one taint (the API's ``Toleration.ToleratesTaint``)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return not key or key == taint.key
    return key == taint.key and str(toleration.get("value") or "") == taint.value


def untolerated(placement: PodPlacement, pool: NodePool) -> list[Taint]:
    """The pool's scheduling-blocking taints that the pod does not tolerate."""
    return [
        taint
        for taint in pool.taints
        if taint.effect in BLOCKING_EFFECTS
        and not any(tolerates(t, taint) for t in placement.tolerations)
    ]


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label-selector or node-selector requirement against a label set."""
    key = expression["key"]
    operator = expression["operator"]
    values = [str(v) for v in expression.get("values") or ()]
    value = labels.get(key)
    if operator in ("Gt", "Lt"):
        return _compares(value, values, greater=operator == "Gt")
    matches = {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }
    return matches.get(operator, False)


def _compares(value: str | None, values: list[str], greater: bool) -> bool:
    try:
        actual, bound = int(value or ""), int(values[0])
    except (ValueError, IndexError):
        return False
    return actual > bound if greater else actual < bound


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector; an empty selector matches everything, None matches nothing."""
    if selector is None:
        return False
    match_labels: Mapping[str, Any] = selector.get("matchLabels") or {}
    if any(labels.get(key) != str(value) for key, value in match_labels.items()):
        return False
    return all(expression_matches(e, labels) for e in selector.get("matchExpressions") or ())


def required_affinity_matches(affinity: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Required node affinity: one of its terms matches (terms of only matchFields are skipped)."""
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    terms = [t for t in required.get("nodeSelectorTerms") or () if t.get("matchExpressions")]
    if not terms:
        return True
    return any(
        all(expression_matches(e, labels) for e in term["matchExpressions"]) for term in terms
    )


def misfit(placement: PodPlacement, pool: NodePool) -> str | None:
    """Why a pod cannot run in a pool, or None when it can."""
    taints = untolerated(placement, pool)
    if taints:
        listed = ", ".join(f"{t.key}={t.value}:{t.effect}" if t.value else t.key for t in taints)
        return f"taint {listed} not tolerated"
    wrong = {
        key: value
        for key, value in placement.node_selector.items()
        if pool.labels.get(key) != str(value)
    }
    if wrong:
        return f"nodeSelector {wrong} does not match"
    if not required_affinity_matches(placement.affinity, pool.labels):
        return "required node affinity does not match"
    return None


def fitting_pools(placement: PodPlacement, pools: Iterable[NodePool]) -> list[NodePool]:
    return [pool for pool in pools if misfit(placement, pool) is None]
