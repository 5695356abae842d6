"""GpuPlatform under Pulumi mocks: pinned charts and the values that matter.

Test double: Pulumi's mock engine instead of a Kubernetes API server and helm (neither can run
here); the Helm releases' recorded inputs are what helm would receive.
"""

from __future__ import annotations

import json

import pulumi
import pytest
import yaml

from infra import monitoring, versions
from infra.render.program import FAKE_PASSWORD, ProgramRun, run_stack
from tests.infra.conftest import EKS_STACK

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_SELECTOR = {"nvidia.com/gpu.present": "true"}


@pytest.mark.parametrize(
    ("chart", "repo", "version"),
    [
        ("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.20.0"),
        ("kube-prometheus-stack", "https://prometheus-community.github.io/helm-charts", "88.5.3"),
        ("dcgm-exporter", "https://nvidia.github.io/dcgm-exporter/helm-charts", "4.8.2"),
        ("prometheus-adapter", "https://prometheus-community.github.io/helm-charts", "5.3.0"),
        ("keda", "https://kedacore.github.io/charts", "2.20.2"),
    ],
)
def test_official_charts_at_pinned_versions(
    eks_run: ProgramRun, chart: str, repo: str, version: str
) -> None:
    release = eks_run.release(chart).inputs
    assert release["repositoryOpts"] == {"repo": repo}
    assert release["version"] == version
    assert release["atomic"] is True


def test_versions_module_is_the_single_source(eks_run: ProgramRun, kubeadm_run: ProgramRun) -> None:
    """Every chart either stack installs is pinned there, and every pinned chart is installed,
    from its publisher (never a local archive: `pulumi up` needs no chart cache)."""
    pinned = {c.reference: c.version for c in versions.PINNED_CHARTS}
    installed = {
        r.inputs["chart"]: r.inputs["version"]
        for run in (eks_run, kubeadm_run)
        for r in run.of_type("kubernetes:helm.sh/v3:Release")
    }
    # Every chart but the EFA device plugin, which only EFA pools need (test_karpenter.py).
    assert installed == {k: v for k, v in pinned.items() if "efa" not in k}


def test_device_plugin_runs_on_tainted_gpu_nodes_only(eks_run: ProgramRun) -> None:
    release = eks_run.release("nvidia-device-plugin").inputs
    assert release["namespace"] == "nvidia-device-plugin"
    assert GPU_TOLERATION in release["values"]["tolerations"]
    assert release["values"]["nodeSelector"] == GPU_SELECTOR


def test_device_plugin_hands_out_devices_by_volume_mount_and_uuid(eks_run: ProgramRun) -> None:
    """The GPU nodes' toolkit ignores NVIDIA_VISIBLE_DEVICES from unprivileged containers."""
    values = eks_run.release("nvidia-device-plugin").inputs["values"]
    assert values["deviceListStrategy"] == "volume-mounts"
    assert values["deviceIDStrategy"] == "uuid"


def test_prometheus_stack_selects_every_monitor_and_rule(eks_run: ProgramRun) -> None:
    values = eks_run.release("kube-prometheus-stack").inputs["values"]
    spec = values["prometheus"]["prometheusSpec"]
    for key in (
        "serviceMonitorSelectorNilUsesHelmValues",
        "podMonitorSelectorNilUsesHelmValues",
        "ruleSelectorNilUsesHelmValues",
        "probeSelectorNilUsesHelmValues",
    ):
        assert spec[key] is False, key


def test_nothing_exposed_outside_the_cluster_by_default(eks_run: ProgramRun) -> None:
    values = eks_run.release("kube-prometheus-stack").inputs["values"]
    assert values["prometheus"]["service"]["type"] == "ClusterIP"
    assert values["grafana"]["service"]["type"] == "ClusterIP"
    assert values["alertmanager"]["service"]["type"] == "ClusterIP"
    assert values["grafana"]["ingress"] == {"enabled": False}
    for release in eks_run.of_type("kubernetes:helm.sh/v3:Release"):
        assert "NodePort" not in json.dumps(release.inputs["values"])
        assert "LoadBalancer" not in json.dumps(release.inputs["values"])


def test_grafana_ingress_only_when_configured() -> None:
    run = run_stack(EKS_STACK, overrides={"grafanaIngressHost": "grafana.example.org"})
    grafana = run.release("kube-prometheus-stack").inputs["values"]["grafana"]
    assert grafana["ingress"]["enabled"] is True
    assert grafana["ingress"]["hosts"] == ["grafana.example.org"]


def test_grafana_password_is_generated_secret_never_the_chart_default(
    eks_run: ProgramRun,
) -> None:
    values = eks_run.release("kube-prometheus-stack").inputs["values"]
    assert values["grafana"]["admin"]["existingSecret"] == "grafana-admin"
    assert "adminPassword" not in values["grafana"]
    assert "prom-operator" not in json.dumps(values)
    secret = eks_run.one("kubernetes:core/v1:Secret", "grafana-admin-secret")
    assert secret.inputs["stringData"]["admin-password"] == FAKE_PASSWORD
    assert "stringData" in secret.secret_paths
    password = eks_run.one("random:index/randomPassword:RandomPassword", "grafana-admin-password")
    assert password.inputs["length"] == 32


def test_configured_grafana_password_is_used_and_stays_secret() -> None:
    run = run_stack(EKS_STACK, secrets={"grafanaAdminPassword": "correct-horse-battery"})
    generated = run.of_type("random:index/randomPassword:RandomPassword")
    assert "grafana-admin-password" not in {r.name for r in generated}
    secret = run.one("kubernetes:core/v1:Secret", "grafana-admin-secret")
    assert secret.inputs["stringData"]["admin-password"] == "correct-horse-battery"
    assert "stringData" in secret.secret_paths
    assert run.outputs["grafanaAdminPassword"] == ("correct-horse-battery", True)


def test_dcgm_exporter_counters_service_monitor_and_attribution(eks_run: ProgramRun) -> None:
    release = eks_run.release("dcgm-exporter").inputs
    values = release["values"]
    assert release["namespace"] == "monitoring"
    assert values["image"]["tag"] == versions.DCGM_EXPORTER_IMAGE_TAG
    assert values["customMetrics"] == monitoring.dcgm_counters_csv()
    # The counters file the chart mounts is the one the exporter is told to read.
    assert values["arguments"] == [
        "--collectors=/etc/dcgm-exporter/default-counters.csv",
        "--collect-interval=10000",
    ]
    monitor = values["serviceMonitor"]
    assert monitor["enabled"] is True
    assert monitor["interval"] == "10s"
    assert monitor["scrapeTimeout"] == "10s"
    assert monitor["honorLabels"] is True
    assert monitor["relabelings"] == [
        {"action": "labeldrop", "regex": "^(namespace|pod|container)$"}
    ]
    assert values["nodeSelector"] == GPU_SELECTOR
    assert values["tolerations"] == [GPU_TOLERATION]


def test_dcgm_exporter_is_sized_for_eight_gpus(eks_run: ProgramRun) -> None:
    """The chart's 512Mi limit OOM-kills exporters on 8-GPU nodes."""
    values = eks_run.release("dcgm-exporter").inputs["values"]
    assert values["resources"] == {
        "requests": {"cpu": "100m", "memory": "512Mi"},
        "limits": {"cpu": "1", "memory": "1024Mi"},
    }
    env = {e["name"]: e for e in values["extraEnv"]}
    assert env["GOMAXPROCS"]["valueFrom"] == {
        "resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}
    }
    # Go's soft limit below the container's, with room for libdcgm's native memory.
    assert env["GOMEMLIMIT"]["value"] == "768MiB"


def test_prometheus_adapter_rules_and_url(eks_run: ProgramRun) -> None:
    values = eks_run.release("prometheus-adapter").inputs["values"]
    assert values["prometheus"] == {
        "url": "http://kube-prometheus-stack-prometheus.monitoring.svc",
        "port": 9090,
    }
    assert values["rules"]["default"] is False
    custom_names = [rule["name"]["as"] for rule in values["rules"]["custom"]]
    assert "gpu_utilization" in custom_names
    # KEDA serves external.metrics.k8s.io in the example stack: the adapter must not claim it.
    assert values["rules"]["external"] == []


@pytest.mark.parametrize("scaler", ["hpa", "none"])
def test_adapter_serves_external_metrics_without_keda(scaler: str) -> None:
    run = run_stack(EKS_STACK, overrides={"workloadAutoscaler": scaler})
    external = run.release("prometheus-adapter").inputs["values"]["rules"]["external"]
    assert [rule["name"]["as"] for rule in external] == ["gpu_utilization_cluster_average"]
    assert external[0]["resources"] == {"namespaced": False}


def test_metrics_interval_must_be_positive() -> None:
    with pytest.raises(pulumi.RunError, match="gpuMetricsIntervalSeconds must be at least 1"):
        run_stack(EKS_STACK, overrides={"gpuMetricsIntervalSeconds": "0"})


def test_fast_metrics_keep_the_scrape_timeout_within_the_interval() -> None:
    """Defect: an interval under the chart's 10 s scrapeTimeout made the operator drop it."""
    run = run_stack(EKS_STACK, overrides={"gpuMetricsIntervalSeconds": "5"})
    monitor = run.release("dcgm-exporter").inputs["values"]["serviceMonitor"]
    assert (monitor["interval"], monitor["scrapeTimeout"]) == ("5s", "5s")


def test_prometheus_keeps_its_data_on_a_volume() -> None:
    """Defect: Prometheus had no persistent volume."""
    eks = run_stack(EKS_STACK).release("kube-prometheus-stack").inputs["values"]
    claim = eks["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "gp3-encrypted"
    assert claim["resources"]["requests"]["storage"] == "50Gi"
    chosen = (
        run_stack(
            EKS_STACK, overrides={"prometheusStorageClass": "io2", "prometheusStorageSize": "200Gi"}
        )
        .release("kube-prometheus-stack")
        .inputs["values"]["prometheus"]["prometheusSpec"]
    )
    claim = chosen["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert (claim["storageClassName"], claim["resources"]["requests"]["storage"]) == (
        "io2",
        "200Gi",
    )


def test_unreachable_control_plane_components_are_not_scraped(eks_run: ProgramRun) -> None:
    """Defect: their scrapes (and "down" alerts) were on where Prometheus cannot reach them."""
    values = eks_run.release("kube-prometheus-stack").inputs["values"]
    for component in ("kubeControllerManager", "kubeScheduler", "kubeEtcd", "kubeProxy"):
        assert values[component] == {"enabled": False}, component


def test_dashboards_are_labelled_config_maps(eks_run: ProgramRun) -> None:
    maps = [
        m
        for m in eks_run.of_type("kubernetes:core/v1:ConfigMap")
        if m.name.startswith("dashboard-")
    ]
    shipped = monitoring.dashboards()
    assert {name for m in maps for name in m.inputs["data"]} == set(shipped)
    for config_map in maps:
        assert config_map.inputs["metadata"]["labels"] == {"grafana_dashboard": "1"}
        assert config_map.inputs["metadata"]["namespace"] == "monitoring"
        for text in config_map.inputs["data"].values():
            assert json.loads(text)["panels"]


def test_prometheus_rule_carries_the_rule_file(eks_run: ProgramRun) -> None:
    rule = eks_run.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule").inputs
    assert rule["spec"] == yaml.safe_load(
        (EKS_STACK.parents[1] / "infra" / "monitoring" / "rules.yaml").read_text()
    )
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {
        "GpuXidError",
        "GpuTemperatureHigh",
        "GpuDoubleBitEccErrors",
        "GpuRowRemapFailure",
        "DcgmExporterDown",
        "GpuAllocatedButIdle",
        "GpuPodPending",
    } <= alerts


def test_kube_state_metrics_exports_the_gpu_and_karpenter_node_labels(eks_run: ProgramRun) -> None:
    """The dashboard's "GPU nodes by state" reads kube_node_labels{label_nvidia_com_gpu_present}."""
    values = eks_run.release("kube-prometheus-stack").inputs["values"]["kube-state-metrics"]
    assert values["metricLabelsAllowlist"] == [
        "nodes=[nvidia.com/gpu.present,karpenter.sh/nodepool,karpenter.sh/capacity-type]"
    ]


def test_every_alert_has_a_runbook_style_description() -> None:
    for group in monitoring.prometheus_rules()["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            annotations = rule["annotations"]
            assert set(annotations) == {"summary", "description", "runbook"}, rule["alert"]
            assert annotations["runbook"].startswith("1. "), rule["alert"]
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
