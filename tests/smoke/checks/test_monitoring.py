"""GPU monitoring: DCGM series for every GPU and the pod using it, the custom metrics API, alert
rules at rest, and Grafana without the chart's default password."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import (
    Cluster,
    ForbiddenError,
    SmokeError,
    eventually,
    fail_on,
)
from tests.smoke.checks.layout import (
    CUSTOM_METRIC_GPU_UTILIZATION,
    CUSTOM_METRICS_API,
    CUSTOM_METRICS_API_SERVICE,
    DCGM_FIELDS,
    GRAFANA_CHART_DEFAULT_PASSWORD,
    GRAFANA_CHART_DEFAULT_USER,
    GRAFANA_PORT,
    GRAFANA_SERVICE,
    SmokeSettings,
    gpu_alert_names,
)
from tests.smoke.checks.pods import PodRun, require_running
from tests.smoke.checks.prometheus import NODE_LABELS, Prometheus
from tests.smoke.checks.scheduling import gpu_count, gpu_nodes, name

pytestmark = pytest.mark.smoke


def test_prometheus_holds_dcgm_series_for_every_gpu(
    cluster: Cluster, settings: SmokeSettings, cluster_prometheus: Prometheus
) -> None:
    exporter = settings.daemon_sets()["dcgm-exporter"]

    def probe() -> list[str]:
        reported = {field: cluster_prometheus.gpus_by_node(field) for field in DCGM_FIELDS}
        problems = []
        for node in gpu_nodes(cluster):
            expected = gpu_count(node, "capacity")
            short = {
                field: len(by_node.get(name(node), ()))
                for field, by_node in reported.items()
                if len(by_node.get(name(node), ())) < (expected or 1)
            }
            if short:
                counts = ", ".join(f"{field} for {have}" for field, have in short.items())
                gpus = f"{expected} GPUs" if expected is not None else "its GPUs"
                problems.append(
                    f"{name(node)}: series of {counts} of {gpus}: check that {exporter}'s pod "
                    "runs there and that Prometheus scrapes it (its ServiceMonitor, and "
                    "Prometheus' targets page)"
                )
        return problems

    fail_on(eventually(probe, settings.timeout_seconds), "Prometheus lacks DCGM series")


def test_dcgm_series_name_the_pod_using_the_gpu(
    settings: SmokeSettings, cluster_prometheus: Prometheus, gpu_holder_pod: PodRun
) -> None:
    """While a test pod holds a GPU, that GPU's series carry the pod's namespace and name."""
    holder = gpu_holder_pod
    require_running(holder)
    field = DCGM_FIELDS[0]
    selector = f'{field}{{namespace="{holder.namespace}",pod="{holder.name}"}}'

    def probe() -> list[str]:
        samples = cluster_prometheus.query(selector)
        if not samples:
            return [
                f"no {field} series carries namespace={holder.namespace}, pod={holder.name} "
                f"while that pod holds a GPU on {holder.node}: dcgm-exporter needs "
                "DCGM_EXPORTER_KUBERNETES=true and the kubelet's pod-resources socket, and its "
                "ServiceMonitor must keep those labels (honorLabels)"
            ]
        problems = []
        seen = {sample["metric"].get("UUID") for sample in samples}
        if holder.gpu_uuids() and seen != set(holder.gpu_uuids()):
            problems.append(
                f"series attribute GPU(s) {sorted(seen)} to {holder.name}, but the pod sees "
                f"{holder.gpu_uuids()}: pod attribution points at the wrong GPU (device plugin "
                "index vs UUID IDs?)"
            )
        nodes = {
            next((sample["metric"][key] for key in NODE_LABELS if key in sample["metric"]), "")
            for sample in samples
        }
        if nodes != {holder.node}:
            problems.append(f"series place {holder.name} on {sorted(nodes)}, not {holder.node}")
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds),
        "DCGM series do not name the pod that uses the GPU",
    )


def test_custom_metrics_api_serves_gpu_utilization(
    cluster: Cluster, settings: SmokeSettings, gpu_holder_pod: PodRun
) -> None:
    holder = gpu_holder_pod
    require_running(holder)
    metric = CUSTOM_METRIC_GPU_UTILIZATION
    path = f"/apis/{CUSTOM_METRICS_API}/namespaces/{holder.namespace}/pods/{holder.name}/{metric}"

    def probe() -> list[str]:
        registration = cluster.get_or_none(
            f"/apis/apiregistration.k8s.io/v1/apiservices/{CUSTOM_METRICS_API_SERVICE}"
        )
        if registration is None:
            return [
                f"APIService {CUSTOM_METRICS_API_SERVICE} does not exist: prometheus-adapter is "
                "not installed, or without custom rules"
            ]
        available = next(
            (
                condition
                for condition in (registration.get("status") or {}).get("conditions") or []
                if condition.get("type") == "Available"
            ),
            {},
        )
        if available.get("status") != "True":
            return [
                f"APIService {CUSTOM_METRICS_API_SERVICE} is not available "
                f"({available.get('reason')}: {available.get('message')}): check the "
                f"prometheus-adapter pod in {settings.monitoring_namespace}"
            ]
        try:
            items = cluster.get(path).get("items") or []
        except ForbiddenError:
            raise
        except SmokeError as error:
            return [
                f"{error}: prometheus-adapter finds no {metric} for the pod; check its rules "
                "(infra/monitoring/adapter-rules.yaml) against the DCGM series' labels"
            ]
        if not any(item.get("describedObject", {}).get("name") == holder.name for item in items):
            return [f"{path} lists no value for {holder.name}: {items}"]
        return []

    fail_on(
        eventually(probe, settings.timeout_seconds),
        f"custom.metrics.k8s.io does not serve {metric}",
    )


def test_gpu_alert_rules_are_loaded_and_none_fire(
    settings: SmokeSettings, cluster_prometheus: Prometheus
) -> None:
    expected = gpu_alert_names()

    def loaded() -> list[str]:
        rules = {rule["name"]: rule for rule in cluster_prometheus.alerting_rules()}
        missing = [alert for alert in expected if alert not in rules]
        if missing:
            return [
                f"not loaded: {', '.join(missing)}; check the PrometheusRule gpu-rules in "
                f"{settings.monitoring_namespace} and that the Prometheus CR's ruleSelector "
                "selects it"
            ]
        return [
            f"{alert} has not been evaluated yet (health {rules[alert].get('health')})"
            for alert in expected
            if rules[alert].get("health") == "unknown"
        ]

    fail_on(eventually(loaded, settings.timeout_seconds), "GPU alert rules are not loaded")
    problems = []
    for rule in cluster_prometheus.alerting_rules():
        if rule["name"] not in expected:
            continue
        if rule.get("health") == "err":
            problems.append(f"{rule['name']} fails to evaluate: {rule.get('lastError')}")
        for alert in rule.get("alerts") or []:
            if alert.get("state") == "firing":
                summary = (alert.get("annotations") or {}).get("summary", "")
                problems.append(
                    f"{rule['name']} is firing at rest: {summary} (labels {alert.get('labels')}); "
                    "follow the rule's runbook annotation"
                )
    fail_on(problems, "GPU alerts fire on a cluster at rest")


def test_grafana_refuses_the_chart_default_password(
    cluster: Cluster, settings: SmokeSettings
) -> None:
    service = f"{settings.monitoring_namespace}/{GRAFANA_SERVICE}:{GRAFANA_PORT}"

    def reachable() -> list[str]:
        health = cluster.proxy(service, "api/health")
        return [] if health.status == 200 else [f"{service} /api/health: {health.status}"]

    fail_on(eventually(reachable, settings.timeout_seconds), "Grafana does not answer")
    login = cluster.proxy(
        service,
        "login",
        method="POST",
        body={"user": GRAFANA_CHART_DEFAULT_USER, "password": GRAFANA_CHART_DEFAULT_PASSWORD},
    )
    if login.status == 200:
        fail_on(
            [
                f"{service} accepts {GRAFANA_CHART_DEFAULT_USER}/{GRAFANA_CHART_DEFAULT_PASSWORD}"
                ", kube-prometheus-stack's default: set grafana.admin.existingSecret (GpuPlatform "
                "does, with a generated password), then change the password of the admin user "
                "in Grafana itself, which keeps it in its database"
            ],
            "Grafana accepts the chart's default password",
        )
    if login.status != 401:
        fail_on(
            [f"{service} answered {login.status} to a login: {login.text()[:300]}"],
            "Grafana's login did not answer as expected",
        )
