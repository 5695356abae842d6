"""The whole object graph a stack creates in its cluster, and what the cluster has before it.

Objects come from two places: the Kubernetes resources the Pulumi program declares directly, and
every Helm release it declares, rendered from the chart cache with the values captured under mocks
(CRDs, templates and hook Jobs; never `helm test` pods). The platform is what exists without the
stack: the node pools it declares (EKS node groups and Karpenter NodePools, or the kubeadm
inventory's hosts), the built-in
namespaces, and the pods and Services Kubernetes itself runs there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from infra import kubeadm_inventory, versions
from infra.render.charts import Capabilities, chart_archive, chart_crds, render, served_crd_versions
from infra.render.program import ProgramRun, Recorded, integral_numbers
from infra.scheduling import NodePool, Taint

BUILTIN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
# Built-in kinds without a namespace; custom kinds take their scope from their CRD.
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "APIService",
        "CertificateSigningRequest",
        "ClusterRole",
        "ClusterRoleBinding",
        "CSIDriver",
        "CSINode",
        "CustomResourceDefinition",
        "FlowSchema",
        "IngressClass",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Node",
        "PersistentVolume",
        "PriorityClass",
        "PriorityLevelConfiguration",
        "RuntimeClass",
        "StorageClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
        "VolumeAttachment",
    }
)
EKS_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}
GA_VERSION = re.compile(r"^v\d+$")


@dataclass
class K8sObject:
    """One object the stack creates, and which Pulumi resource or Helm release creates it."""

    manifest: dict[str, Any]
    source: str  # "helm/<release>" or the Pulumi component ("gpu-platform", "stack")
    hook: frozenset[str] = frozenset()

    @property
    def api_version(self) -> str:
        return str(self.manifest.get("apiVersion", ""))

    @property
    def kind(self) -> str:
        return str(self.manifest.get("kind", ""))

    @property
    def metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = self.manifest.setdefault("metadata", {})
        return metadata

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str | None:
        namespace = self.metadata.get("namespace")
        return str(namespace) if namespace else None

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.metadata.get("labels") or {}
        return labels

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name} ({self.source})"


@dataclass(frozen=True)
class PlatformPods:
    """Pods the cluster runs by itself, e.g. CoreDNS, and whether Prometheus can scrape them."""

    namespace: str
    labels: Mapping[str, str]
    metrics_reachable: bool
    what: str


@dataclass
class Platform:
    """What the cluster has before the stack's objects arrive."""

    name: str  # "eks", "kubeadm", or "cluster" when the program creates no cluster
    kubernetes_version: str  # "1.31" or "1.31.2"
    pools: list[NodePool] = field(default_factory=list)
    namespaces: frozenset[str] = BUILTIN_NAMESPACES
    services: list[dict[str, Any]] = field(default_factory=list)
    pods: list[PlatformPods] = field(default_factory=list)
    # StorageClasses the cluster has without the stack (render --assume-storage-class).
    storage_classes: frozenset[str] = frozenset()

    @property
    def kube_version(self) -> str:
        parts = self.kubernetes_version.lstrip("v").split(".")
        return "v" + ".".join([*parts, "0", "0"][:3])


@dataclass(frozen=True)
class Release:
    """A Helm release the program declares: its chart archive and the values it passes."""

    name: str
    namespace: str
    chart: Path
    values: dict[str, Any]
    skip_crds: bool = False


@dataclass
class ObjectGraph:
    objects: list[K8sObject]
    platform: Platform
    releases: list[Release] = field(default_factory=list)

    def of_kind(self, *kinds: str) -> list[K8sObject]:
        return [o for o in self.objects if o.kind in kinds]

    def find(self, kind: str, name: str, namespace: str | None = None) -> K8sObject | None:
        return next(
            (
                o
                for o in self.objects
                if o.kind == kind
                and o.name == name
                and (namespace is None or o.namespace == namespace)
            ),
            None,
        )

    def crd_scopes(self) -> dict[tuple[str, str], str]:
        """``(group, Kind) -> "Namespaced" | "Cluster"`` for every CRD in the graph."""
        return {
            (crd.manifest["spec"]["group"], crd.manifest["spec"]["names"]["kind"]): crd.manifest[
                "spec"
            ].get("scope", "Namespaced")
            for crd in self.of_kind("CustomResourceDefinition")
        }

    def is_namespaced(
        self, obj: K8sObject, scopes: Mapping[tuple[str, str], str] | None = None
    ) -> bool:
        group = obj.api_version.rpartition("/")[0]
        scope = (self.crd_scopes() if scopes is None else scopes).get((group, obj.kind))
        if scope is not None:
            return scope == "Namespaced"
        return obj.kind not in CLUSTER_SCOPED_KINDS


@cache
def builtin_api_versions(kube_version: str) -> tuple[str, ...]:
    """The GA ``group/version`` and ``group/version/Kind`` a Kubernetes version serves."""
    wanted = tuple(int(p) for p in kube_version.lstrip("v").split(".")[:2])
    folder = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    available = sorted(
        (tuple(int(p) for p in entry.name[1:].split("-")[0].split(".")[:2]), entry.name)
        for entry in folder.iterdir()
        if re.fullmatch(r"v\d+\.\d+\.\d+-local", entry.name)
    )
    chosen = [name for version, name in available if version <= wanted][-1]
    definitions = json.loads(folder.joinpath(chosen, "_definitions.json").read_text())
    served = set()
    for name, schema in definitions["$defs"].items():
        if not name.startswith(("io.k8s.api.", "io.k8s.kube-aggregator.", "io.k8s.apiextensions")):
            continue
        for gvk in schema.get("x-kubernetes-group-version-kind", ()):
            if not GA_VERSION.match(gvk["version"]) or gvk["kind"].endswith("List"):
                continue
            group_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            served.update({group_version, f"{group_version}/{gvk['kind']}"})
    return tuple(sorted(served))


def _eks_platform(run: ProgramRun) -> Platform:
    cluster = run.one("eks:index:Cluster").inputs
    pools = []
    for group in run.of_type("eks:index:ManagedNodeGroup"):
        inputs = group.inputs
        arch = "arm64" if "ARM" in str(inputs.get("amiType", "")) else "amd64"
        labels = {
            **(inputs.get("labels") or {}),
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
            "eks.amazonaws.com/nodegroup": group.name,
            "eks.amazonaws.com/capacityType": inputs.get("capacityType", "ON_DEMAND"),
        }
        taints = tuple(
            Taint(key=t["key"], value=str(t.get("value", "")), effect=EKS_EFFECTS[t["effect"]])
            for t in inputs.get("taints") or ()
        )
        size = int((inputs.get("scalingConfig") or {}).get("desiredSize", 0))
        pools.append(NodePool(name=group.name, labels=labels, taints=taints, size=size))
    return Platform(
        name="eks",
        kubernetes_version=str(cluster.get("version") or versions.KUBERNETES_VERSION),
        pools=pools,
        services=[_kubernetes_service(), _dns_service()],
        pods=[
            PlatformPods("kube-system", {"k8s-app": "kube-dns"}, True, "CoreDNS add-on"),
            # kube-proxy's metrics listen on 127.0.0.1:10249.
            PlatformPods("kube-system", {"k8s-app": "kube-proxy"}, False, "kube-proxy add-on"),
            PlatformPods("kube-system", {"k8s-app": "aws-node"}, True, "VPC CNI"),
        ],
    )


def _kubeadm_platform(run: ProgramRun, command: Recorded) -> Platform:
    env = command.inputs["environment"]
    extra_vars = json.loads(env.get("GPU_CLUSTER_EXTRA_VARS") or "{}")
    nodes = kubeadm_inventory.read_nodes(Path(env["GPU_CLUSTER_INVENTORY"]), extra_vars)
    control_plane = [
        # kubeadm's static pods bind their metrics to 127.0.0.1 (the API server aside).
        PlatformPods("kube-system", {"component": component}, False, f"kubeadm {component}")
        for component in ("etcd", "kube-controller-manager", "kube-scheduler")
    ]
    return Platform(
        name="kubeadm",
        kubernetes_version=kubeadm_inventory.kubernetes_version(nodes),
        pools=[node.pool() for node in nodes],
        services=[_kubernetes_service(), _dns_service()],
        pods=[
            PlatformPods("kube-system", {"k8s-app": "kube-dns"}, True, "CoreDNS"),
            PlatformPods("kube-system", {"k8s-app": "kube-proxy"}, False, "kube-proxy"),
            PlatformPods("kube-system", {"component": "kube-apiserver"}, True, "kube-apiserver"),
            *control_plane,
        ],
    )


def _kubernetes_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {"component": "apiserver", "provider": "kubernetes"},
        },
        "spec": {"ports": [{"name": "https", "port": 443}]},
    }


def _dns_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "kube-dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns"},
        },
        "spec": {
            "selector": {"k8s-app": "kube-dns"},
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53},
                {"name": "metrics", "port": 9153},
            ],
        },
    }


def karpenter_pools(objects: list[K8sObject]) -> list[NodePool]:
    """The node pools of Karpenter NodePools: the labels and taints of the nodes they launch.

    Labels are the template's, Karpenter's own, and each requirement that allows one value.
    """
    pools = []
    for pool in objects:
        if pool.kind != "NodePool" or not pool.api_version.startswith("karpenter.sh/"):
            continue
        template = (pool.manifest.get("spec") or {}).get("template") or {}
        spec = template.get("spec") or {}
        labels = {
            **{
                r["key"]: str(r["values"][0])
                for r in spec.get("requirements") or ()
                if r.get("operator") == "In" and len(r.get("values") or ()) == 1
            },
            **((template.get("metadata") or {}).get("labels") or {}),
            "karpenter.sh/nodepool": pool.name,
        }
        taints = tuple(
            Taint(key=t["key"], value=str(t.get("value", "")), effect=t["effect"])
            for t in spec.get("taints") or ()
        )
        pools.append(
            NodePool(
                name=f"karpenter/{pool.name}",
                labels=labels,
                taints=taints,
                size=0,
                provisioned=True,
            )
        )
    return pools


def platform_of(run: ProgramRun) -> Platform:
    """The cluster the program creates, from its EKS cluster or its kubeadm playbook command."""
    if run.of_type("eks:index:Cluster"):
        return _eks_platform(run)
    commands = [
        r
        for r in run.of_type("command:local:Command")
        if "GPU_CLUSTER_INVENTORY" in (r.inputs.get("environment") or {})
    ]
    if commands:
        return _kubeadm_platform(run, commands[0])
    return Platform(name="cluster", kubernetes_version=versions.KUBERNETES_VERSION)


def _component(run: ProgramRun, resource: Recorded) -> str:
    owner = run.by_urn(resource.parent)
    while owner is not None:
        if owner.typ.startswith("gpu-cluster:"):
            return owner.name
        owner = run.by_urn(owner.parent)
    return "stack"


def _release(resource: Recorded, cache_dir: Path | None) -> Release:
    inputs = resource.inputs
    # An OCI chart is named by its URL (oci://host/path/<name>), a chart installed from the cache
    # by its archive (<cache>/<name>-<version>.tgz); the archive in the cache by the name.
    chart = inputs["chart"].rpartition("/")[2].removesuffix(f"-{inputs['version']}.tgz")
    return Release(
        name=inputs.get("name") or resource.name,
        namespace=inputs["namespace"],
        chart=chart_archive(chart, inputs["version"], cache_dir),
        values=integral_numbers(inputs.get("values") or {}),
        skip_crds=bool(inputs.get("skipCrds")),
    )


def build_graph(run: ProgramRun, cache_dir: Path | None = None) -> ObjectGraph:
    """Every object the program's stack creates, with the platform it lands on."""
    platform = platform_of(run)
    objects = [
        K8sObject(manifest=integral_numbers(resource.inputs), source=_component(run, resource))
        for resource in run.kubernetes_resources()
    ]
    releases = [_release(resource, cache_dir) for resource in run.releases()]
    crds = [
        crd for release in releases if not release.skip_crds for crd in chart_crds(release.chart)
    ]
    capabilities = Capabilities(
        kube_version=platform.kube_version,
        api_versions=tuple(
            sorted({*builtin_api_versions(platform.kube_version), *served_crd_versions(crds)})
        ),
    )
    graph = ObjectGraph(objects=objects, platform=platform, releases=releases)
    for release in releases:
        rendered = render(
            release.chart,
            release.values,
            release.name,
            release.namespace,
            capabilities,
            skip_crds=release.skip_crds,
        )
        added = [
            K8sObject(r.manifest, source=f"helm/{release.name}", hook=r.hook) for r in rendered
        ]
        graph.objects.extend(added)
        scopes = graph.crd_scopes()
        for obj in added:
            # Helm installs a namespaced object without a namespace into the release's namespace.
            if obj.namespace is None and graph.is_namespaced(obj, scopes):
                obj.metadata["namespace"] = release.namespace
    platform.pools.extend(karpenter_pools(graph.objects))
    return graph
