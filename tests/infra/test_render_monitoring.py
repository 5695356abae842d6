"""The ``monitoring`` and ``grafana`` checks on the rendered graph, and what the monitoring
releases render to: scrape timeouts, control-plane scrapes, rule selection and jobs, dcgm-exporter's
counters, Grafana's dashboards, Secrets and sidecar RBAC.

Test doubles as in test_render.py: the stack programs under Pulumi's mock engine, the pinned charts
rendered by Helm's own engine.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from infra import monitoring, platform
from infra.render.graph import ObjectGraph
from infra.render.program import ProgramRun
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK
from tests.infra.render_support import check, graph_of, one, pod_spec

pytestmark = pytest.mark.charts


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
