"""The object graph of both stacks, their Helm releases rendered with the real charts.

Test doubles: the stack programs run under Pulumi's mock engine (infra/render/program.py) instead of
the Pulumi CLI and a cloud; the charts are the pinned ones from the chart cache
(``$GPU_CLUSTER_CHART_CACHE``), rendered by Helm's own engine (helm-python-sdk) with the
capabilities `helm install` would see; a Kubernetes API server is replaced by schema validation
(kubernetes-validate, the charts' CRDs).
Every check passes on the stacks as shipped, and each fails, naming the object, on the defect it
is there to catch (built here by changing one value or one object).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra import monitoring, platform, versions
from infra.kubeadm_inventory import read_nodes
from infra.render.checks import CHECKS, run_checks
from infra.render.graph import K8sObject, ObjectGraph, build_graph
from infra.render.program import FAKE_CERTIFICATE, ProgramRun, run_stack
from infra.scheduling import NodePool, PodPlacement, Taint, misfit
from tests.infra.conftest import CAPACITY_BLOCK_GROUP, EKS_STACK, H100_POOL, KUBEADM_STACK

pytestmark = pytest.mark.charts

NO_FINDINGS = {name: [] for name in CHECKS}
VARIANTS: dict[str, tuple[Path, dict[str, Any], dict[str, str]]] = {
    "eks": (EKS_STACK, {}, {}),
    "kubeadm": (KUBEADM_STACK, {}, {}),
    "eks-with-options": (
        EKS_STACK,
        {
            "grafanaIngressHost": "grafana.example.org",
            "gpuMetricsIntervalSeconds": "5",
            "exampleWorkload": None,
            "profilerStore": "external",
            "profilerStoreCa": FAKE_CERTIFICATE,
        },
        {"profilerStoreUrl": "postgresql+psycopg://p:x@db/p", "grafanaAdminPassword": "pw"},
    ),
    "eks-rds": (EKS_STACK, {"profilerStore": "rds"}, {}),
    "kubeadm-sqlite": (KUBEADM_STACK, {"profilerStore": "sqlite"}, {}),
    "eks-hpa": (EKS_STACK, {"workloadAutoscaler": "hpa"}, {}),
    "eks-karpenter-only": (
        EKS_STACK,
        {"gpuNodeGroups": [], "karpenter": {"capacityTypes": ["spot", "on-demand"], "gpuLimit": 8}},
        {},
    ),
    "eks-without-karpenter": (EKS_STACK, {"karpenter": {"enabled": False}}, {}),
    "kubeadm-with-trial-runner": (KUBEADM_STACK, {"trialRunner": {"maxGpus": 4}}, {}),
    "kubeadm-example-without-autoscaler": (
        KUBEADM_STACK,
        {
            "workloadAutoscaler": "none",
            "exampleWorkload": {"namespace": "ml", "createNamespace": True, "minReplicas": 2},
        },
        {},
    ),
    # MIG mixed on the A100 group, time-slicing on the g5 group and Karpenter's pool.
    "eks-gpu-sharing": (
        EKS_STACK,
        {
            "gpuSharing": {
                "configs": {
                    "mig-mixed": {"migStrategy": "mixed"},
                    "shared-4": {"sharing": "time-slicing", "replicas": 4},
                }
            },
            "gpuNodeGroups": [
                {"name": "g5", "instanceTypes": ["g5.2xlarge"], "devicePluginConfig": "shared-4"},
                {
                    "name": "p4d",
                    "instanceTypes": ["p4d.24xlarge"],
                    "devicePluginConfig": "mig-mixed",
                },
            ],
            "karpenter": {"gpuLimit": 8, "devicePluginConfig": "shared-4"},
        },
        {},
    ),
    # Per-node configs on kubeadm, MPS (experimental) among them, time-sliced nodes by default.
    "kubeadm-gpu-sharing": (
        KUBEADM_STACK,
        {
            "gpuSharing": {
                "default": "shared-2",
                "configs": {
                    "mig-mixed": {"migStrategy": "mixed"},
                    "shared-2": {"sharing": "time-slicing", "replicas": 2},
                    "mps-4": {"sharing": "mps", "replicas": 4},
                },
            },
            "gpuNodeConfigs": {"gpu-1": "mig-mixed", "gpu-2": "mps-4"},
        },
        {},
    ),
    "kubeadm-with-options": (
        KUBEADM_STACK,
        {
            "gpuNodeNames": ["gpu-1"],
            "monitoringNamespace": "observability",
            "prometheusStorageClass": "local-path",
        },
        {},
    ),
}
# The example inventory as it shipped: both workers GPU nodes, so every node tainted.
SHIPPED_INVENTORY = """\
[gpu_nodes]
gpu-1 ansible_host=192.0.2.11
gpu-2 ansible_host=192.0.2.12
[control_plane]
cp-1 ansible_host=192.0.2.10
[workers]
gpu-1
gpu-2
"""


def graph_of(
    stack: Path,
    overrides: dict[str, Any] | None = None,
    change_values: Callable[[ProgramRun], None] | None = None,
) -> ObjectGraph:
    """A stack's graph, its release values changed first (to rebuild a defect) when asked."""
    run = run_stack(stack, overrides=overrides)
    if change_values is not None:
        change_values(run)
    return build_graph(run)


def one(graph: ObjectGraph, kind: str, name: str) -> K8sObject:
    found = [o for o in graph.objects if o.kind == kind and o.name == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def check(graph: ObjectGraph, name: str, assumed: frozenset[str] = frozenset()) -> list[str]:
    return CHECKS[name](graph, assumed)


def pod_spec(obj: K8sObject) -> dict[str, Any]:
    spec: dict[str, Any] = obj.manifest["spec"]["template"]["spec"]
    return spec


# -- the graph ----------------------------------------------------------------------------------


H100_CONFIG: dict[str, Any] = {
    "availabilityZones": ["us-west-2a", "us-west-2b"],
    "gpuNodeGroups": [CAPACITY_BLOCK_GROUP],
    "karpenter": H100_POOL,
}


@pytest.mark.charts(versions.EFA_DEVICE_PLUGIN)
def test_every_check_passes_on_h100_capacity_with_efa() -> None:
    """Capacity Blocks, reservations, EFA and RAID0 : the node class
    is valid for the pinned CRDs, and the EFA device plugin reaches both EFA pools."""
    graph = build_graph(run_stack(EKS_STACK, overrides=H100_CONFIG))
    assert run_checks(graph) == NO_FINDINGS
    plugin = one(graph, "DaemonSet", "aws-efa-k8s-device-plugin")
    placement = PodPlacement.of(pod_spec(plugin))
    efa_pools = [p.name for p in graph.platform.pools if misfit(placement, p) is None]
    assert efa_pools == ["gpu-eks-h100-nodes", "karpenter/gpu"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_check_passes(variant: str) -> None:
    stack, overrides, secrets = VARIANTS[variant]
    graph = build_graph(run_stack(stack, overrides=overrides, secrets=secrets))
    assert run_checks(graph) == NO_FINDINGS


def test_the_graph_holds_what_helm_install_creates(eks_graph: ObjectGraph) -> None:
    sources = {o.source for o in eks_graph.objects}
    assert sources == {
        "stack",  # the StorageClass
        "gpu-platform",
        "gpu-profiler",
        "helm/nvidia-device-plugin",
        "helm/kube-prometheus-stack",
        "helm/dcgm-exporter",
        "helm/prometheus-adapter",
        "helm/keda",
        "workload-autoscaling",
        "karpenter",
        "helm/karpenter",
        "helm/karpenter-crd",
        "profiler-store",  # the CloudNativePG database, its pooler, Secrets and policies
        "helm/cloudnative-pg",
    }
    crds = {o.name for o in eks_graph.of_kind("CustomResourceDefinition")}
    assert {"prometheuses.monitoring.coreos.com", "servicemonitors.monitoring.coreos.com"} <= crds
    hooks = {o.name: o.hook for o in eks_graph.of_kind("Job")}
    assert hooks == {
        "kube-prometheus-stack-admission-create": frozenset({"pre-install", "pre-upgrade"}),
        "kube-prometheus-stack-admission-patch": frozenset({"post-install", "post-upgrade"}),
        # node-feature-discovery (GFD's subchart) removes its node labels on uninstall.
        "nvidia-device-plugin-node-feature-discovery-prune": frozenset({"post-delete"}),
    }
    # `helm test` pods are no part of an install.
    assert not [o for o in eks_graph.of_kind("Pod") if "test" in o.name]
    # Helm puts namespaced objects without a namespace into the release's.
    assert one(eks_graph, "Deployment", "kube-prometheus-stack-operator").namespace == "monitoring"
    # Capabilities as the cluster would report them: the adapter's APIServices are rendered.
    apis = {o.name for o in eks_graph.of_kind("APIService")}
    assert "v1beta1.custom.metrics.k8s.io" in apis
    assert eks_graph.platform.kube_version == "v1.35.0"


def test_services_the_smoke_suite_reaches(eks_graph: ObjectGraph) -> None:
    """Names, namespaces and ports the cluster smoke suite reaches through the API's proxy."""
    ports = {
        (o.namespace, o.name): {p["port"]: p.get("name") for p in o.manifest["spec"]["ports"]}
        for o in eks_graph.of_kind("Service")
    }
    assert ports[("monitoring", "kube-prometheus-stack-prometheus")][9090] == "http-web"
    assert ports[("monitoring", "kube-prometheus-stack-grafana")][80] == "http-web"
    assert ports[("monitoring", "dcgm-exporter")][9400] == "metrics"
    assert ports[("gpu-profiler", "gpu-profiler")][9401] == "metrics"
    assert ports[("monitoring", "prometheus-adapter")][443] == "https"
    daemon_sets = {(o.namespace, o.name) for o in eks_graph.of_kind("DaemonSet")}
    assert {
        ("nvidia-device-plugin", "nvidia-device-plugin"),
        ("monitoring", "dcgm-exporter"),
        ("gpu-profiler", "gpu-profiler"),
    } <= daemon_sets
    assert not [
        o
        for o in eks_graph.of_kind("Service")
        if o.manifest["spec"].get("type", "ClusterIP") != "ClusterIP"
    ]


# -- scheduling ---------------------------------------------------------------------------------


def test_scheduling_catches_the_shipped_kubeadm_inventory(
    kubeadm_graph: ObjectGraph, tmp_path: Path
) -> None:
    """Every worker a GPU node and the control plane tainted: nothing system runs."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(SHIPPED_INVENTORY)
    graph = copy.deepcopy(kubeadm_graph)
    graph.platform.pools = [node.pool() for node in read_nodes(inventory)]
    findings = check(graph, "scheduling")
    stuck = {line.split(" (")[0] for line in findings}
    assert stuck == {
        "Deployment monitoring/kube-prometheus-stack-operator",
        "Deployment monitoring/kube-prometheus-stack-grafana",
        "Deployment monitoring/kube-prometheus-stack-kube-state-metrics",
        "Prometheus monitoring/kube-prometheus-stack-prometheus",
        "Alertmanager monitoring/kube-prometheus-stack-alertmanager",
        "Job monitoring/kube-prometheus-stack-admission-create",  # the pre-install hook
        "Job monitoring/kube-prometheus-stack-admission-patch",
        "Deployment monitoring/prometheus-adapter",
        "Deployment keda/keda-operator",
        "Deployment keda/keda-operator-metrics-apiserver",
        "Deployment keda/keda-admission-webhooks",
        "Deployment nvidia-device-plugin/nvidia-device-plugin-node-feature-discovery-gc",
        # The profiler's database: the operator, its instances and pooler, their volumes' provider.
        "Deployment cnpg-system/cloudnative-pg",
        "Cluster gpu-profiler-store/gpu-profiler-store",
        "Pooler gpu-profiler-store/gpu-profiler-store-pooler",
        "Deployment local-path-storage/local-path-provisioner",
    }
    assert all(
        "gpu-1: taint nvidia.com/gpu=present:NoSchedule not tolerated" in line
        and "cp-1: taint node-role.kubernetes.io/control-plane not tolerated" in line
        for line in findings
    )


def test_scheduling_needs_nodes_in_the_fitting_pool(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    system = next(p for p in graph.platform.pools if not p.is_gpu)
    graph.platform.pools = [
        NodePool(p.name, p.labels, p.taints, size=0) if p is system else p
        for p in graph.platform.pools
    ]
    findings = check(graph, "scheduling")
    assert any(
        "Deployment monitoring/kube-prometheus-stack-grafana" in line
        and "gpu-eks-system-nodes: no nodes (desired size 0)" in line
        for line in findings
    )
    assert not [line for line in findings if line.startswith("DaemonSet")]


def test_gpu_daemon_sets_must_reach_every_gpu_pool(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    graph.platform.pools.append(
        NodePool(
            "reserved-gpus",
            {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"},
            (Taint("nvidia.com/gpu", "NoSchedule", "present"), Taint("team", "NoSchedule", "ml")),
        )
    )
    missed = {line.split(" (")[0].split(":")[0] for line in check(graph, "scheduling")}
    assert missed == {
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin",
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin-gpu-feature-discovery",
        "DaemonSet monitoring/dcgm-exporter",
        "DaemonSet gpu-profiler/gpu-profiler",
        "GPU pool reserved-gpus",
    }


# -- namespaces ---------------------------------------------------------------------------------


def test_namespaces_catch_a_workload_in_a_namespace_nothing_creates() -> None:
    """The example HPA in namespace `inference`, which nothing created."""
    graph = graph_of(EKS_STACK, {"exampleWorkload": {"namespace": "inference"}})
    findings = check(graph, "namespaces")
    assert {line.split(" (")[0] for line in findings} == {
        "Deployment inference/llm-server",
        "Service inference/llm-server",
        "PodMonitor inference/llm-server",
        "ScaledObject inference/llm-server",
    }
    assert all(
        "namespace inference is neither created by the stack nor built in" in f for f in findings
    )
    assert check(graph, "namespaces", frozenset({"inference"})) == []


# -- monitoring ---------------------------------------------------------------------------------


def test_monitoring_catches_a_scrape_timeout_above_the_interval() -> None:
    """A 5 s interval under the chart's 10 s scrapeTimeout; the operator drops it."""

    def as_before_the_fix(run: ProgramRun) -> None:
        del run.release("dcgm-exporter").inputs["values"]["serviceMonitor"]["scrapeTimeout"]

    graph = graph_of(EKS_STACK, {"gpuMetricsIntervalSeconds": "5"}, as_before_the_fix)
    assert check(graph, "monitoring") == [
        "ServiceMonitor monitoring/dcgm-exporter (helm/dcgm-exporter): endpoint metrics has "
        "scrapeTimeout 10s > interval 5s; prometheus-operator drops it"
    ]


@pytest.mark.parametrize(
    ("stack", "reason"),
    [
        (EKS_STACK, "selects no pods"),
        (KUBEADM_STACK, "whose metrics are not reachable from Prometheus on kubeadm"),
    ],
    ids=["eks", "kubeadm"],
)
def test_monitoring_catches_control_plane_scrapes_that_cannot_work(
    stack: Path, reason: str
) -> None:
    """Controller-manager, scheduler and etcd (and kube-proxy) scraped in vain."""

    def as_before_the_fix(run: ProgramRun) -> None:
        values = run.release("kube-prometheus-stack").inputs["values"]
        for component in platform.UNREACHABLE_CONTROL_PLANE:
            del values[component]

    findings = check(graph_of(stack, change_values=as_before_the_fix), "monitoring")
    scraped = {line.split(" (")[0] for line in findings}
    assert scraped == {
        f"ServiceMonitor monitoring/kube-prometheus-stack-{name}"
        for name in ("kube-controller-manager", "kube-scheduler", "kube-etcd", "kube-proxy")
    }
    assert any(reason in line for line in findings)
    assert any("kube-proxy" in line and "not reachable" in line for line in findings)


def test_monitoring_catches_unselected_rules_unknown_jobs_and_ports(
    eks_graph: ObjectGraph,
) -> None:
    graph = copy.deepcopy(eks_graph)
    prometheus = one(graph, "Prometheus", "kube-prometheus-stack-prometheus")
    prometheus.manifest["spec"]["ruleSelector"] = {"matchLabels": {"release": "kps"}}
    rules = one(graph, "PrometheusRule", "gpu-rules")
    text = json.dumps(rules.manifest).replace('job=\\"dcgm-exporter\\"', 'job=\\"dcgm\\"')
    rules.manifest.update(json.loads(text))
    monitor = one(graph, "ServiceMonitor", "gpu-profiler")
    monitor.manifest["spec"]["endpoints"][0]["port"] = "http"
    findings = check(graph, "monitoring")
    assert (
        "PrometheusRule monitoring/gpu-rules (gpu-platform): no Prometheus selects it (labels {})"
        in findings
    )
    assert (
        "PrometheusRule monitoring/gpu-rules (gpu-platform): DcgmExporterDown queries job 'dcgm', "
        "which nothing scrapes" in findings
    )
    assert (
        "ServiceMonitor gpu-profiler/gpu-profiler (gpu-profiler): no selected Service has a port "
        "named http" in findings
    )


# -- references ---------------------------------------------------------------------------------


def test_references_catch_urls_and_service_refs_that_lead_nowhere(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    profiler = one(graph, "DaemonSet", "gpu-profiler")
    for env in pod_spec(profiler)["containers"][0]["env"]:
        if env["name"] == "GPU_PROFILER_PROMETHEUS_URL":
            env["value"] = env["value"].replace(":9090", ":9091")
    adapter = one(graph, "Deployment", "prometheus-adapter")
    container = pod_spec(adapter)["containers"][0]
    container["args"] = [a.replace(".monitoring.svc", ".monitor.svc") for a in container["args"]]
    api = one(graph, "APIService", "v1beta1.custom.metrics.k8s.io")
    api.manifest["spec"]["service"]["name"] = "adapter"
    findings = check(graph, "references")
    assert sorted(findings) == [
        "APIService v1beta1.custom.metrics.k8s.io (helm/prometheus-adapter): spec.service: "
        "no Service monitoring/adapter port 443",
        "DaemonSet gpu-profiler/gpu-profiler (gpu-profiler): container gpu-profiler env "
        "GPU_PROFILER_PROMETHEUS_URL: kube-prometheus-stack-prometheus.monitoring.svc:9091: "
        "Service monitoring/kube-prometheus-stack-prometheus has no port 9091",
        "Deployment monitoring/prometheus-adapter (helm/prometheus-adapter): container "
        "prometheus-adapter args: kube-prometheus-stack-prometheus.monitor.svc:9090: "
        "namespace monitor does not exist",
    ]


def test_grafana_datasource_url_is_checked(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    datasources = one(graph, "ConfigMap", "kube-prometheus-stack-grafana-datasource")
    text = datasources.manifest["data"]["datasource.yaml"]
    assert "http://kube-prometheus-stack-prometheus.monitoring:9090/" in text
    datasources.manifest["data"]["datasource.yaml"] = text.replace(
        "kube-prometheus-stack-prometheus.monitoring", "prometheus.monitoring"
    )
    findings = check(graph, "references")
    assert any("no Service prometheus in namespace monitoring" in line for line in findings)


# -- grafana ------------------------------------------------------------------------------------


def test_grafana_catches_unlabelled_dashboards_and_missing_secret_keys(
    eks_graph: ObjectGraph,
) -> None:
    graph = copy.deepcopy(eks_graph)
    dashboard = one(graph, "ConfigMap", "dashboard-gpu-profiler")
    dashboard.metadata["labels"] = {"grafana_dashboards": "1"}
    secret = one(graph, "Secret", "grafana-admin")
    secret.manifest["stringData"] = {"user": "admin", "password": "x"}
    findings = check(graph, "grafana")
    assert (
        "ConfigMap monitoring/dashboard-gpu-profiler (gpu-platform): a dashboard without the "
        "sidecar's label grafana_dashboard=1" in findings
    )
    assert any(
        "container grafana env GF_SECURITY_ADMIN_PASSWORD: Secret grafana-admin has no key "
        "admin-password" in line
        for line in findings
    )
    graph.objects.remove(secret)
    assert any("no Secret monitoring/grafana-admin" in line for line in check(graph, "grafana"))


# -- schema and values --------------------------------------------------------------------------


def test_schema_catches_dcgm_exporter_arguments_as_numbers() -> None:
    """The chart writes `arguments` unquoted: ["-c", "10000"] became an integer in args."""

    def as_before_the_fix(run: ProgramRun) -> None:
        values = run.release("dcgm-exporter").inputs["values"]
        values["arguments"] = ["-f", platform.DCGM_COUNTERS_PATH, "-c", "10000"]

    findings = check(graph_of(EKS_STACK, change_values=as_before_the_fix), "schema")
    assert findings == [
        "DaemonSet monitoring/dcgm-exporter (helm/dcgm-exporter): "
        "spec.template.spec.containers.0.args.3: 10000 is not of type 'string', 'null'"
    ]


def test_schema_checks_built_in_kinds_crd_kinds_and_unknown_kinds(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    service = one(graph, "Service", "gpu-profiler")
    service.manifest["spec"]["clusterIp"] = service.manifest["spec"].pop("clusterIP")
    monitor = one(graph, "ServiceMonitor", "gpu-profiler")
    monitor.manifest["spec"]["endpoints"][0]["prot"] = "metrics"
    rules = one(graph, "PrometheusRule", "gpu-rules")
    del rules.manifest["spec"]["groups"][0]["rules"][0]["expr"]
    graph.objects.append(
        K8sObject(
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
            source="stack",
        )
    )
    findings = {line.split(" (")[0]: line for line in check(graph, "schema")}
    assert set(findings) == {
        "Service gpu-profiler/gpu-profiler",
        "ServiceMonitor gpu-profiler/gpu-profiler",
        "PrometheusRule monitoring/gpu-rules",
        "Widget w",
    }
    assert "'clusterIp' was unexpected" in findings["Service gpu-profiler/gpu-profiler"]
    assert "'prot' was unexpected" in findings["ServiceMonitor gpu-profiler/gpu-profiler"]
    assert (
        "spec.groups.0.rules.0: 'expr' is a required property"
        in findings["PrometheusRule monitoring/gpu-rules"]
    )
    assert findings["Widget w"] == (
        "Widget w (stack): no schema for example.com/v1 Widget in Kubernetes v1.35.0, and no "
        "CRD for it in the stack"
    )


def test_values_catch_a_key_the_chart_does_not_have() -> None:
    """What the key inventories did, against the chart itself: Helm ignores unknown keys."""

    def misspelt(run: ProgramRun) -> None:
        values = run.release("dcgm-exporter").inputs["values"]
        values["serviceMonitor"]["honourLabels"] = True
        values["grafana"] = {"enabled": True}

    findings = check(graph_of(EKS_STACK, change_values=misspelt), "values")
    assert findings == [
        "release dcgm-exporter: value serviceMonitor.honourLabels is not one the chart "
        "dcgm-exporter-4.8.2.tgz has; Helm ignores it",
        "release dcgm-exporter: value grafana is not one the chart dcgm-exporter-4.8.2.tgz has; "
        "Helm ignores it",
    ]


# -- what the fixes render to -------------------------------------------------------------------


def test_dcgm_exporter_as_rendered(eks_graph: ObjectGraph) -> None:
    exporter = one(eks_graph, "DaemonSet", "dcgm-exporter")
    (container,) = pod_spec(exporter)["containers"]
    assert container["args"] == [
        "--collectors=/etc/dcgm-exporter/default-counters.csv",
        "--collect-interval=10000",
    ]
    counters = hashlib.sha256(monitoring.dcgm_counters_csv().encode()).hexdigest()
    annotations = exporter.manifest["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/dcgm-counters"] == counters
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["GOMEMLIMIT"] == "768MiB"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1024Mi"}
    (gomaxprocs,) = (e for e in container["env"] if e["name"] == "GOMAXPROCS")
    assert gomaxprocs["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
    # SYS_ADMIN: profiling fields, and the toolkit honours its NVIDIA_VISIBLE_DEVICES.
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    monitor = one(eks_graph, "ServiceMonitor", "dcgm-exporter")
    (endpoint,) = monitor.manifest["spec"]["endpoints"]
    assert endpoint["metricRelabelings"] == platform.node_label_relabelings()
    assert endpoint["metricRelabelings"][0]["sourceLabels"] == ["Hostname", "hostname"]
    config_map = one(eks_graph, "ConfigMap", "exporter-metrics-config-map")
    assert config_map.manifest["data"]["metrics"] == monitoring.dcgm_counters_csv()


def test_changed_counters_roll_the_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counters are mounted with subPath, so only new pods see an edit."""
    before = platform.dcgm_exporter_values(platform.GpuPlatformArgs())["podAnnotations"]
    edited = monitoring.dcgm_counters_csv() + "DCGM_FI_DEV_SM_CLOCK, gauge, SM clock.\n"
    monkeypatch.setattr(monitoring, "dcgm_counters_csv", lambda: edited)
    after = platform.dcgm_exporter_values(platform.GpuPlatformArgs())["podAnnotations"]
    assert before["checksum/dcgm-counters"] != after["checksum/dcgm-counters"]


def test_device_plugin_as_rendered(eks_graph: ObjectGraph) -> None:
    plugin = one(eks_graph, "DaemonSet", "nvidia-device-plugin")
    # Beside it runs the config-manager sidecar that follows the node's config label.
    (container,) = [
        c for c in pod_spec(plugin)["containers"] if c["name"] == "nvidia-device-plugin-ctr"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DEVICE_LIST_STRATEGY"] == "volume-mounts"
    assert env["DEVICE_ID_STRATEGY"] == "uuid"
    # The chart adds SYS_ADMIN for volume-mounts: the plugin itself still sees every GPU.
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]


@pytest.mark.parametrize("graph_name", ["eks_graph", "kubeadm_graph"])
def test_gpu_feature_discovery_labels_every_gpu_pool(
    graph_name: str, request: pytest.FixtureRequest
) -> None:
    """GFD (nvidia.com/gpu.product, which trials place by) and the node-feature-discovery worker
    it needs run on every GPU pool; NFD's master and garbage collector fit a pool with nodes (the
    whole graph's checks, scheduling included, pass: test_every_check_passes_on_the_stacks)."""
    graph: ObjectGraph = request.getfixturevalue(graph_name)
    gfd = one(graph, "DaemonSet", "nvidia-device-plugin-gpu-feature-discovery")
    worker = one(graph, "DaemonSet", "nvidia-device-plugin-node-feature-discovery-worker")
    gpu_pools = [pool for pool in graph.platform.pools if pool.is_gpu]
    assert gpu_pools
    for daemon_set in (gfd, worker):
        placement = PodPlacement.of(pod_spec(daemon_set))
        assert [misfit(placement, pool) for pool in gpu_pools] == [None] * len(gpu_pools)
    for name in ("master", "gc"):
        deployment = one(graph, "Deployment", f"nvidia-device-plugin-node-feature-discovery-{name}")
        placement = PodPlacement.of(pod_spec(deployment))
        assert [p for p in graph.platform.pools if p.has_nodes and misfit(placement, p) is None]


@pytest.mark.parametrize("graph_name", ["eks_graph", "kubeadm_graph"])
def test_control_plane_scrapes_and_rules_are_off(
    graph_name: str, request: pytest.FixtureRequest
) -> None:
    graph: ObjectGraph = request.getfixturevalue(graph_name)
    names = {o.name for o in graph.of_kind("ServiceMonitor", "Service", "PrometheusRule")}
    prefix = "kube-prometheus-stack-"
    for gone in ("kube-controller-manager", "kube-scheduler", "kube-etcd", "kube-proxy", "etcd"):
        assert f"{prefix}{gone}" not in names
    assert not [n for n in names if "scheduler" in n or "controller-manager" in n]
    assert {f"{prefix}apiserver", f"{prefix}kubelet", f"{prefix}coredns"} <= names


def test_prometheus_volume_as_rendered(eks_graph: ObjectGraph, kubeadm_graph: ObjectGraph) -> None:
    prometheus = one(eks_graph, "Prometheus", "kube-prometheus-stack-prometheus")
    claim = prometheus.manifest["spec"]["storage"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "gp3-encrypted"
    storage_class = one(eks_graph, "StorageClass", "gp3-encrypted")
    assert storage_class.manifest["provisioner"] == "ebs.csi.aws.com"
    assert storage_class.manifest["volumeBindingMode"] == "WaitForFirstConsumer"
    assert storage_class.manifest["parameters"] == {"type": "gp3", "encrypted": "true"}
    # kubeadm clusters bring no storage provisioner: none unless prometheusStorageClass names one.
    plain = one(kubeadm_graph, "Prometheus", "kube-prometheus-stack-prometheus")
    assert "storage" not in plain.manifest["spec"]


def test_grafana_reads_config_maps_not_every_secret(eks_graph: ObjectGraph) -> None:
    """The chart's own ClusterRole lets Grafana read every Secret in the cluster (CKV2_K8S_5)."""
    binding = one(
        eks_graph, "ClusterRoleBinding", "kube-prometheus-stack-grafana-clusterrolebinding"
    )
    assert binding.manifest["roleRef"]["name"] == platform.GRAFANA_SIDECAR_ROLE
    role = one(eks_graph, "ClusterRole", platform.GRAFANA_SIDECAR_ROLE)
    assert role.manifest["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "watch", "list"]}
    ]
    assert not [
        o for o in eks_graph.of_kind("ClusterRole") if o.name.endswith("grafana-clusterrole")
    ]
    grafana = one(eks_graph, "Deployment", "kube-prometheus-stack-grafana")
    sidecars = [c for c in pod_spec(grafana)["containers"] if c["name"].startswith("grafana-sc-")]
    assert {c["name"] for c in sidecars} == {"grafana-sc-dashboard", "grafana-sc-datasources"}
    for sidecar in sidecars:
        assert {"name": "RESOURCE", "value": "configmap"} in sidecar["env"]


def test_references_catch_a_binding_to_a_missing_role(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    graph.objects.remove(one(graph, "ClusterRole", platform.GRAFANA_SIDECAR_ROLE))
    assert check(graph, "references") == [
        "ClusterRoleBinding kube-prometheus-stack-grafana-clusterrolebinding "
        "(helm/kube-prometheus-stack): roleRef ClusterRole grafana-sidecar-configmap-reader does "
        "not exist"
    ]


# -- workload autoscaling -----------------------------------------------------------------------


def test_scaled_object_is_valid_for_kedas_own_crd(eks_graph: ObjectGraph) -> None:
    """The ScaledObject is checked against the schema of the CRD the pinned KEDA chart carries."""
    crd = one(eks_graph, "CustomResourceDefinition", "scaledobjects.keda.sh")
    assert crd.source == "helm/keda"
    graph = copy.deepcopy(eks_graph)
    scaled = one(graph, "ScaledObject", "llm-server")
    assert check(graph, "schema") == []
    scaled.manifest["spec"]["minReplicas"] = scaled.manifest["spec"].pop("minReplicaCount")
    scaled.manifest["spec"]["triggers"][0].pop("type")
    (finding,) = check(graph, "schema")
    assert finding.startswith("ScaledObject inference/llm-server (workload-autoscaling): ")
    assert "(and 1 more)" in finding


def test_conflicts_catch_two_external_metrics_servers() -> None:
    """Defect: prometheus-adapter and KEDA both registering v1beta1.external.metrics.k8s.io."""

    def as_before_the_fix(run: ProgramRun) -> None:
        values = run.release("prometheus-adapter").inputs["values"]
        values["rules"]["external"] = monitoring.adapter_rules()["external"]

    graph = graph_of(EKS_STACK, change_values=as_before_the_fix)
    assert check(graph, "conflicts") == [
        "APIService v1beta1.external.metrics.k8s.io (helm/keda): helm/prometheus-adapter "
        "creates it too"
    ]


def test_scalers_and_references_catch_a_trigger_that_leads_nowhere(
    eks_graph: ObjectGraph,
) -> None:
    graph = copy.deepcopy(eks_graph)
    scaled = one(graph, "ScaledObject", "llm-server")
    scaled.manifest["spec"]["scaleTargetRef"]["name"] = "llm"
    metadata = scaled.manifest["spec"]["triggers"][0]["metadata"]
    metadata["serverAddress"] = metadata["serverAddress"].replace(":9090", ":9091")
    assert check(graph, "scalers") == [
        "ScaledObject inference/llm-server (workload-autoscaling): scales Deployment "
        "inference/llm, which the stack does not create"
    ]
    assert check(graph, "references") == [
        "ScaledObject inference/llm-server (workload-autoscaling): trigger 0 serverAddress: "
        "kube-prometheus-stack-prometheus.monitoring.svc:9091: Service "
        "monitoring/kube-prometheus-stack-prometheus has no port 9091"
    ]
    del metadata["query"]
    assert "trigger 0 needs serverAddress and query" in check(graph, "scalers")[1]


# -- Karpenter ----------------------------------------------------------------------------------


def test_node_pool_and_node_class_are_valid_for_the_pinned_crds(eks_graph: ObjectGraph) -> None:
    for name in ("nodepools.karpenter.sh", "ec2nodeclasses.karpenter.k8s.aws"):
        assert one(eks_graph, "CustomResourceDefinition", name).source == "helm/karpenter-crd"
    graph = copy.deepcopy(eks_graph)
    pool = one(graph, "NodePool", "gpu")
    pool.manifest["spec"]["disruption"]["consolidationPolicy"] = "WhenIdle"  # Karpenter v0.x
    node_class = one(graph, "EC2NodeClass", "gpu")
    node_class.manifest["spec"]["amiFamily"] = "Ubuntu"
    findings = {line.split(" (")[0]: line for line in check(graph, "schema")}
    assert set(findings) == {"NodePool gpu", "EC2NodeClass gpu"}
    assert (
        "spec.disruption.consolidationPolicy: 'WhenIdle' is not one of" in findings["NodePool gpu"]
    )
    assert "spec.amiFamily: 'Ubuntu' is not one of" in findings["EC2NodeClass gpu"]


def test_karpenter_pools_are_node_pools_with_nodes_on_demand(eks_graph: ObjectGraph) -> None:
    (pool,) = [p for p in eks_graph.platform.pools if p.name == "karpenter/gpu"]
    assert pool.is_gpu
    assert pool.provisioned
    assert pool.labels["karpenter.sh/nodepool"] == "gpu"
    assert pool.labels["kubernetes.io/os"] == "linux"
    assert Taint("nvidia.com/gpu", "NoSchedule", "present") in pool.taints


def test_scheduling_counts_on_karpenter_to_launch_gpu_nodes() -> None:
    """With no GPU node group, the example GPU workload fits only because Karpenter adds nodes."""
    graph = graph_of(EKS_STACK, {"gpuNodeGroups": []})
    assert check(graph, "scheduling") == []
    graph.platform.pools = [
        NodePool(p.name, p.labels, p.taints, p.size) for p in graph.platform.pools
    ]
    (finding,) = check(graph, "scheduling")
    assert finding.startswith("Deployment inference/llm-server (workload-autoscaling): fits no")
    assert "karpenter/gpu: no nodes (desired size 0)" in finding


def test_scheduling_catches_gpu_nodes_the_device_plugin_never_reaches() -> None:
    """The pitfall: a Karpenter node is initialised only once the device plugin registers GPUs."""

    def reserved(run: ProgramRun) -> None:
        pool = run.one("kubernetes:karpenter.sh/v1:NodePool").inputs
        pool["spec"]["template"]["spec"]["taints"].append(
            {"key": "team", "value": "ml", "effect": "NoSchedule"}
        )

    findings = check(graph_of(EKS_STACK, change_values=reserved), "scheduling")
    assert {line.split(" (")[0].split(":")[0] for line in findings} == {
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin",
        "DaemonSet nvidia-device-plugin/nvidia-device-plugin-gpu-feature-discovery",
        "DaemonSet monitoring/dcgm-exporter",
        "DaemonSet gpu-profiler/gpu-profiler",
        "GPU pool karpenter/gpu",
    }
    assert (
        "GPU pool karpenter/gpu: no NVIDIA device plugin runs there, so its nodes never register "
        "nvidia.com/gpu (Karpenter never counts them initialised)" in findings
    )
