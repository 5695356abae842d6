"""The ``scheduling`` check: every workload (Helm hook Jobs and operator-made pods included:
Prometheus', the database's instances and pooler) fits a node pool of the stack, with nodes to run
on (Karpenter NodePools launch theirs); DaemonSets aimed at GPU nodes cover every GPU pool, and
NVIDIA's device plugin runs in each; every volume claim (the database's, Prometheus') names a
StorageClass the stack creates or the cluster has (``--assume-storage-class``), or there is a
default class."""

from __future__ import annotations

from collections.abc import Iterator

from infra.gpu import GPU_NODE_LABEL_KEY, GPU_RESOURCE
from infra.render.checks.objects import MONITORING_GROUP, pod_containers, pod_spec, workloads
from infra.render.cnpg import cnpg_claims
from infra.render.graph import K8sObject, ObjectGraph
from infra.scheduling import NodePool, PodPlacement, fitting_pools, misfit

DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"  # nvcr.io/nvidia/k8s-device-plugin
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
# Labels that feature discovery (NFD, NVIDIA's GPU feature discovery) puts on nodes at run time: a
# DaemonSet that needs one runs only where an operator opted in, so fitting no pool is expected.
DISCOVERED_LABEL_PREFIXES = ("feature.node.kubernetes.io/", "nvidia.com/mps.", "nvidia.com/mig.")


def scheduling_findings(graph: ObjectGraph) -> list[str]:
    pools = graph.platform.pools
    if not pools:
        return [
            f"the stack declares no node pools on {graph.platform.name}: nothing to schedule on"
        ]
    findings = []
    gpu_pools = [p for p in pools if p.is_gpu]
    for workload in workloads(graph):
        placement = PodPlacement.of(workload.spec)
        fitting = fitting_pools(placement, pools)
        if not workload.every_node:
            fitting = [p for p in fitting if p.has_nodes]
        opt_in = workload.every_node and any(
            key.startswith(DISCOVERED_LABEL_PREFIXES) for key in placement.node_selector
        )
        if not fitting and not opt_in:
            reasons = "; ".join(
                f"{p.name}: {misfit(placement, p) or 'no nodes (desired size 0)'}" for p in pools
            )
            findings.append(f"{workload.owner}: fits no node pool with nodes ({reasons})")
        elif not opt_in and workload.every_node and placement.node_selector.get(GPU_NODE_LABEL_KEY):
            for pool in gpu_pools:
                reason = misfit(placement, pool)
                if reason:
                    findings.append(f"{workload.owner}: misses GPU pool {pool.name}: {reason}")
    findings.extend(_device_plugin_findings(graph, gpu_pools))
    findings.extend(_claim_findings(graph))
    return findings


def volume_claims(graph: ObjectGraph) -> Iterator[tuple[K8sObject, str, str | None]]:
    """``(owner, what, storage class or None)`` of every volume claim the stack's objects make:
    PersistentVolumeClaims, StatefulSets' claim templates, Prometheus' and Alertmanager's storage,
    the database's instances."""
    for obj in graph.objects:
        spec = obj.manifest.get("spec") or {}
        if obj.kind == "PersistentVolumeClaim":
            yield obj, "claim", spec.get("storageClassName")
        elif obj.kind == "StatefulSet":
            for template in spec.get("volumeClaimTemplates") or ():
                name = (template.get("metadata") or {}).get("name")
                yield obj, f"claim {name}", (template.get("spec") or {}).get("storageClassName")
        elif obj.api_version == MONITORING_GROUP and obj.kind in ("Prometheus", "Alertmanager"):
            template = (spec.get("storage") or {}).get("volumeClaimTemplate")
            if template is not None:
                claim = template.get("spec") or {}
                yield obj, "storage", claim.get("storageClassName")
    yield from cnpg_claims(graph)


def _claim_findings(graph: ObjectGraph) -> Iterator[str]:
    """A claim's StorageClass exists: one the stack creates or the cluster has; a claim that names
    none needs a default class."""
    classes = {c.name: c for c in graph.of_kind("StorageClass")}
    existing = set(classes) | set(graph.platform.storage_classes)
    default = [
        name
        for name, c in classes.items()
        if str(c.metadata.get("annotations", {}).get(DEFAULT_CLASS_ANNOTATION)) == "true"
    ]
    for owner, what, storage_class in volume_claims(graph):
        if storage_class and storage_class not in existing:
            yield (
                f"{owner}: {what}: StorageClass {storage_class} is neither created by the stack "
                f"nor said to exist (render --assume-storage-class); its volume would stay Pending"
            )
        elif not storage_class and not default:
            yield (
                f"{owner}: {what}: names no StorageClass and the cluster has no default one; "
                f"its volume would stay Pending"
            )


def _device_plugin_findings(graph: ObjectGraph, gpu_pools: list[NodePool]) -> Iterator[str]:
    """Every GPU pool runs NVIDIA's device plugin: without it no node there registers
    nvidia.com/gpu, no GPU pod fits, and Karpenter never counts its nodes initialised."""
    plugins = [
        PodPlacement.of(pod_spec(obj))
        for obj in graph.of_kind("DaemonSet")
        if any(DEVICE_PLUGIN_IMAGE in str(c.get("image")) for c in pod_containers(pod_spec(obj)))
    ]
    for pool in gpu_pools:
        if not any(misfit(plugin, pool) is None for plugin in plugins):
            yield (
                f"GPU pool {pool.name}: no NVIDIA device plugin runs there, so its nodes never "
                f"register {GPU_RESOURCE} (Karpenter never counts them initialised)"
            )
