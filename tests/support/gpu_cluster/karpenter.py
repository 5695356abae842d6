"""A stand-in Karpenter for the stand-in GPU cluster: a TEST DOUBLE of the Karpenter controller and
the ``karpenter.sh/v1`` NodeClaims it serves, for the smoke suite's scaling check.

No cloud can be reached here, so this models what the check observes, as the real controller
behaves: kubernetes-sigs/karpenter at the commit that aws/karpenter-provider-aws v1.14.1 (the
chart infra/versions.py pins) builds with (go.mod: sigs.k8s.io/karpenter
v1.14.1-0.20260819221709-6e7eab7a0f48): the NodeClaim's conditions in
pkg/apis/v1/nodeclaim_status.go (Launched, Registered, Initialized, and the root Ready), their
reasons in pkg/controllers/nodeclaim/lifecycle/launch.go and initialization.go, the
``karpenter.sh/nodepool`` label in pkg/apis/v1/labels.go. One GPU NodePool, ``gpu``, whose nodes
carry the GPU label and taint of infra/gpu.py.

- Provisioning: a pod the scheduler left Pending, that requests ``nvidia.com/gpu`` and that the
  NodePool's nodes would admit (its nodeSelector, tolerations), gets a NodeClaim of its own.
  After ``launch_seconds`` the NodeClaim is Launched and Registered and a Node joins: the GPU
  layer's DaemonSets put their pods on it, the device plugin's registers ``nvidia.com/gpu``,
  the NodeClaim is Initialized and the scheduler binds the waiting pods. Without a ready device
  plugin there, the NodeClaim stays ``Initialized=Unknown`` (``ResourceNotRegistered``,
  ``Resource "nvidia.com/gpu" was requested but not registered``: initialization.go), as the
  real one does, and is never consolidated. With ``launch_failure`` the NodeClaim stays
  ``Launched=Unknown`` with that reason and message (launch.go sets a failed launch Unknown,
  ``LaunchFailed`` or the cloud provider's reason), and no node comes. The root ``Ready`` is
  Unknown then; its reason is not modelled.
- Consolidation (the empty-node half of the stacks' ``WhenEmptyOrUnderutilized``): an initialised
  node with no Pending or Running pod but DaemonSet pods for ``consolidate_after_seconds`` goes
  away with its NodeClaim and DaemonSet pods, unless ``consolidates`` is False.

Not modelled: instance types, prices, spot, NodePool limits, drift, expiry, moving pods off
underutilised nodes, disruption budgets, ``karpenter.sh/do-not-disrupt``, termination grace,
DaemonSet status counts after a node joins, watches of NodeClaims.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import TYPE_CHECKING

from infra.gpu import GPU_NODE_LABEL_KEY, GPU_NODE_LABEL_VALUE, GPU_RESOURCE
from tests.support.gpu_cluster import controllers, objects
from tests.support.gpu_cluster.kubelet import PodKey, Reply, not_found
from tests.support.gpu_cluster.objects import Json
from tests.support.gpu_cluster.scenario import GPU_TAINT, GpuNode, Karpenter

if TYPE_CHECKING:
    from tests.support.gpu_cluster.apiserver import StandInGpuCluster

API_VERSION = "karpenter.sh/v1"
NODE_CLASS_API = "karpenter.k8s.aws/v1"
NODE_POOL = "gpu"
NODE_POOL_LABEL = "karpenter.sh/nodepool"
TICK_SECONDS = 0.05
ACTIVE_PHASES = ("Pending", "Running")


CONDITIONS = ("Launched", "Registered", "Initialized", "Ready")


def _conditions(
    met: int, status: str = "Unknown", reason: str = "", message: str = ""
) -> list[Json]:
    """The NodeClaim's conditions: the first ``met`` True, the next ``status`` for ``reason``,
    the rest Unknown."""

    def condition(index: int, kind: str) -> Json:
        if index < met:
            return {"type": kind, "status": "True", "reason": "", "message": ""}
        if index == met:
            return {"type": kind, "status": status, "reason": reason, "message": message}
        return {"type": kind, "status": "Unknown", "reason": "", "message": ""}

    return [condition(index, kind) for index, kind in enumerate(CONDITIONS)]


def _initialized(claim: Json) -> bool:
    return any(
        condition["type"] == "Initialized" and condition["status"] == "True"
        for condition in claim["status"]["conditions"]
    )


def _is_daemon_pod(pod: Json) -> bool:
    owners = pod["metadata"].get("ownerReferences") or []
    return any(owner.get("kind") == "DaemonSet" for owner in owners)


class StandInKarpenter:
    """Karpenter of ``cluster`` as ``config`` describes it. ``start`` runs its control loop on a
    thread; the API server's routes read ``node_claims``. Methods not marked otherwise expect the
    cluster's lock held."""

    def __init__(self, cluster: StandInGpuCluster, config: Karpenter) -> None:
        self._cluster = cluster
        self._config = config
        self.node_claims: dict[str, Json] = {}
        self._claimed: dict[PodKey, str] = {}  # pod -> its NodeClaim
        self._launch_at: dict[str, float] = {}  # NodeClaim -> when its instance is up
        self._empty_since: dict[str, float] = {}  # node -> when its last workload pod ended
        self._count = 0
        self._launched = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        """The control loop (takes the lock)."""
        while not self._stopping.wait(TICK_SECONDS):
            with self._cluster.lock:
                now = time.monotonic()
                self._provision(now)
                self._launch(now)
                self._consolidate(now)

    # -- provisioning ----------------------------------------------------------------------

    def _prospective_node(self, name: str) -> Json:
        labels = {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE, NODE_POOL_LABEL: NODE_POOL}
        return objects.node_manifest(name, labels=labels, taints=[GPU_TAINT.manifest()])

    def _provision(self, now: float) -> None:
        """A NodeClaim for every unschedulable GPU pod that the NodePool admits."""
        if not self._config.launches:
            return
        shape = self._prospective_node("prospective")
        for key, pod in self._cluster.state.pods.items():
            spec = pod.get("spec") or {}
            if (
                key in self._claimed
                or spec.get("nodeName")
                or pod.get("status", {}).get("phase") != "Pending"
                or not objects.gpus_requested(spec)
                or objects.misfit(shape, spec, free_gpus=self._config.gpus_per_node)
            ):
                continue
            self._count += 1
            claim_name = f"{NODE_POOL}-{objects.suffix(key[0], key[1], str(self._count))}"
            self.node_claims[claim_name] = self._node_claim(claim_name)
            self._claimed[key] = claim_name
            self._launch_at[claim_name] = now + self._config.launch_seconds

    def _node_claim(self, name: str) -> Json:
        return {
            "apiVersion": API_VERSION,
            "kind": "NodeClaim",
            "metadata": {
                "name": name,
                "uid": objects.suffix("nodeclaim", name, length=12),
                "labels": {NODE_POOL_LABEL: NODE_POOL},
                "creationTimestamp": objects.now_rfc3339(),
            },
            "spec": {
                "nodeClassRef": {
                    "group": "karpenter.k8s.aws",
                    "kind": "EC2NodeClass",
                    "name": "gpu",
                },
                "resources": {"requests": {GPU_RESOURCE: str(self._config.gpus_per_node)}},
                "taints": [GPU_TAINT.manifest()],
            },
            "status": {"conditions": _conditions(0)},
        }

    def _launch(self, now: float) -> None:
        """NodeClaims whose instance is up: a node joins, or the launch failed."""
        for claim_name, moment in list(self._launch_at.items()):
            if moment > now:
                continue
            del self._launch_at[claim_name]
            claim = self.node_claims[claim_name]
            if self._config.launch_failure is not None:
                reason, message = self._config.launch_failure
                claim["status"]["conditions"] = _conditions(0, "Unknown", reason, message)
                continue
            self._launched += 1
            node_name = f"ip-10-0-7-{self._launched}.ec2.internal"
            provider_id = f"aws:///us-west-2a/i-{objects.suffix(claim_name, length=17)}"
            claim["status"] |= {"nodeName": node_name, "providerID": provider_id}
            if self._join(node_name):
                claim["status"]["conditions"] = _conditions(len(CONDITIONS))
            else:
                message = f'Resource "{GPU_RESOURCE}" was requested but not registered'
                conditions = _conditions(2, "Unknown", "ResourceNotRegistered", message)
                claim["status"]["conditions"] = conditions

    def _join(self, name: str) -> bool:
        """The node registers; the DaemonSets, the device plugin and the scheduler act on it.
        Whether it is initialised: the device plugin registered its GPUs."""
        gpu_node = GpuNode(name, gpus=self._config.gpus_per_node)
        joined = self._prospective_node(name)
        pods, _ = controllers.workloads(self._cluster.scenario, {name: joined})
        daemon_pods = [pod for pod in pods if _is_daemon_pod(pod)]
        for pod in daemon_pods:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            self._cluster.commit("pods", key, pod, "ADDED")
        node = controllers.published_node(joined, gpu_node, daemon_pods, self._cluster.scenario)
        self._cluster.gpu_nodes[name] = gpu_node
        self._cluster.commit("nodes", name, node, event=None)
        self._cluster.pods.bind_pending()
        return GPU_RESOURCE in node["status"]["allocatable"]

    # -- consolidation ---------------------------------------------------------------------

    def _consolidate(self, now: float) -> None:
        for claim_name, claim in list(self.node_claims.items()):
            node = claim["status"].get("nodeName")
            if node is None or not _initialized(claim):  # Karpenter leaves those alone
                continue
            busy = any(
                pod["spec"].get("nodeName") == node
                and not _is_daemon_pod(pod)
                and pod.get("status", {}).get("phase") in ACTIVE_PHASES
                for pod in self._cluster.state.pods.values()
            )
            if busy:
                self._empty_since.pop(node, None)
                continue
            since = self._empty_since.setdefault(node, now)
            if self._config.consolidates and now - since >= self._config.consolidate_after_seconds:
                self._remove(claim_name, node)

    def _remove(self, claim_name: str, node: str) -> None:
        """The node drains and terminates; its NodeClaim and DaemonSet pods go with it."""
        state = self._cluster.state
        for key, pod in list(state.pods.items()):
            if pod["spec"].get("nodeName") == node:
                self._cluster.commit("pods", key, pod, "DELETED")
        state.nodes.pop(node, None)
        self._cluster.gpu_nodes.pop(node, None)
        self._empty_since.pop(node, None)
        del self.node_claims[claim_name]
        self._claimed = {key: name for key, name in self._claimed.items() if name != claim_name}

    # -- the API (StandInGpuCluster's routes) ----------------------------------------------

    def list_node_claims(self) -> Reply:
        items = [copy.deepcopy(claim) for _, claim in sorted(self.node_claims.items())]
        return 200, {
            "apiVersion": API_VERSION,
            "kind": "NodeClaimList",
            "metadata": {},
            "items": items,
        }

    def _with_ready(self, obj: Json, not_ready: tuple[str, str] | None) -> Json:
        ready = {"type": "Ready", "status": "True", "reason": "Ready", "message": ""}
        if not_ready is not None:
            ready = {
                "type": "Ready",
                "status": "False",
                "reason": not_ready[0],
                "message": not_ready[1],
            }
        return {**obj, "status": {"conditions": [ready]}}

    def list_node_pools(self) -> Reply:
        pool = {
            "apiVersion": API_VERSION,
            "kind": "NodePool",
            "metadata": {"name": NODE_POOL},
            "spec": {"template": {"spec": {"nodeClassRef": {"name": NODE_POOL}}}},
        }
        items = [self._with_ready(pool, self._config.node_pool_not_ready)]
        return 200, {
            "apiVersion": API_VERSION,
            "kind": "NodePoolList",
            "metadata": {},
            "items": items,
        }

    def list_node_classes(self) -> Reply:
        node_class = {
            "apiVersion": NODE_CLASS_API,
            "kind": "EC2NodeClass",
            "metadata": {"name": NODE_POOL},
            "spec": {"amiSelectorTerms": [{"alias": "al2023@latest"}]},
        }
        items = [self._with_ready(node_class, self._config.node_class_not_ready)]
        listing = {"apiVersion": NODE_CLASS_API, "kind": "EC2NodeClassList", "metadata": {}}
        return 200, {**listing, "items": items}

    def node_claim(self, name: str) -> Reply:
        found = self.node_claims.get(name)
        if found is None:
            return not_found("nodeclaims.karpenter.sh", name)
        return 200, copy.deepcopy(found)
