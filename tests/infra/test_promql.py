"""Every PromQL expression the project ships, run on a real Prometheus over a realistic dataset.

Covers alert and recording rule expressions, Grafana panel targets (with their template variables
filled in as Grafana would) and prometheus-adapter rules (seriesQuery as a series match, and
metricsQuery after the adapter's template substitution). Each must parse and return data, except
``absent()`` alerts, which must return nothing while the target exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from infra import monitoring
from infra.render.program import ProgramRun
from tests.infra import monitoring_dataset
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

# Alerts whose expression is empty while things are healthy (absent() of a present series).
EMPTY_WHEN_PRESENT = {"DcgmExporterAbsent"}
GRAFANA_VARIABLES = {"$node": ".*", "$__rate_interval": "2m", "$__range": "3h"}


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with PrometheusServer(monitoring_dataset.build()) as server:
        yield server


def query(server: PrometheusServer, promql: str) -> list[dict[str, Any]]:
    response = requests.get(f"{server.url}/api/v1/query", params={"query": promql}, timeout=30)
    body = response.json()
    assert response.status_code == 200, f"{promql}: {body.get('error')}"
    assert body["status"] == "success"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def rule_expressions() -> list[tuple[str, str]]:
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in monitoring.prometheus_rules()["groups"]
        for rule in group["rules"]
    ]


def grafana_expression(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def adapter_query(
    rule: dict[str, Any], pods: str = 'namespace="ml",pod=~"trainer-0|notebook-0"'
) -> str:
    """metricsQuery as the adapter sends it for ``pods`` (custom) or the cluster (external)."""
    series = re.match(r"\w+", rule["seriesQuery"].strip("'\""))
    assert series is not None
    namespaced = "overrides" in rule.get("resources", {})
    return str(
        rule["metricsQuery"]
        .replace("<<.Series>>", series.group(0))
        .replace("<<.LabelMatchers>>", pods if namespaced else "")
        .replace("<<.GroupBy>>", "pod" if namespaced else "")
    )


@pytest.mark.parametrize(("name", "expr"), rule_expressions())
def test_rule_expression_returns_data(prometheus: PrometheusServer, name: str, expr: str) -> None:
    result = query(prometheus, expr)
    if name in EMPTY_WHEN_PRESENT:
        assert result == []
    else:
        assert result, f"{name}: no data for {expr}"


@pytest.mark.parametrize(
    ("dashboard", "panel", "expr"),
    monitoring.dashboard_targets(),
    ids=[f"{d}:{p}" for d, p, _ in monitoring.dashboard_targets()],
)
def test_dashboard_target_returns_data(
    prometheus: PrometheusServer, dashboard: str, panel: str, expr: str
) -> None:
    assert query(prometheus, grafana_expression(expr)), f"{dashboard} / {panel}: no data"


def adapter_rules() -> list[dict[str, Any]]:
    rules = monitoring.adapter_rules()
    return [*rules["custom"], *rules["external"]]


@pytest.mark.parametrize("rule", adapter_rules(), ids=lambda r: r["name"]["as"])
def test_adapter_rule_discovers_series_and_answers(
    prometheus: PrometheusServer, rule: dict[str, Any]
) -> None:
    response = requests.get(
        f"{prometheus.url}/api/v1/series", params={"match[]": rule["seriesQuery"]}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.json()["data"], f"seriesQuery finds nothing: {rule['seriesQuery']}"
    result = query(prometheus, adapter_query(rule))
    assert result
    if "overrides" in rule.get("resources", {}):
        assert {sample["metric"]["pod"] for sample in result} == {"trainer-0", "notebook-0"}


def test_the_waste_alert_names_the_idle_pod_only(prometheus: PrometheusServer) -> None:
    expr = dict(rule_expressions())["GpuAllocatedButIdle"]
    pods = {sample["metric"].get("pod") for sample in query(prometheus, expr)}
    assert pods == {"notebook-0"}


def test_per_pod_gpu_utilization_metric_values(prometheus: PrometheusServer) -> None:
    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == "gpu_utilization"]
    values = {
        sample["metric"]["pod"]: float(sample["value"][1])
        for sample in query(prometheus, adapter_query(rule))
    }
    assert values["notebook-0"] == 0.0
    assert values["trainer-0"] in (5.0, 95.0)


def test_the_scaled_objects_query_returns_its_gpu_pods_utilization(
    prometheus: PrometheusServer, eks_run: ProgramRun
) -> None:
    """The example stack's KEDA trigger, as declared: the llm-server pod's GPU at 40 %."""
    scaled = eks_run.one("kubernetes:keda.sh/v1alpha1:ScaledObject").inputs
    (trigger,) = scaled["spec"]["triggers"]
    (sample,) = query(prometheus, trigger["metadata"]["query"])
    assert float(sample["value"][1]) == 40.0
    # The HPA path reads the same number per pod through the adapter rule.
    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == monitoring.GPU_UTILIZATION_METRIC]
    per_pod = query(prometheus, adapter_query(rule, 'namespace="inference",pod=~"llm-server-.*"'))
    assert [float(s["value"][1]) for s in per_pod] == [40.0]
    # Another Deployment's pods (none here) give no series: KEDA reads that as 0.
    other = trigger["metadata"]["query"].replace("llm-server-", "embedder-")
    assert query(prometheus, other) == []


def test_gpu_pod_pending_names_the_waiting_pod_only(prometheus: PrometheusServer) -> None:
    expr = dict(rule_expressions())["GpuPodPending"]
    assert [(s["metric"], s["value"][1]) for s in query(prometheus, expr)] == [
        ({"namespace": "ml", "pod": "trainer-1"}, "1")
    ]


def test_gpu_nodes_by_state(prometheus: PrometheusServer) -> None:
    """node-a and node-b ready with GPUs; Karpenter's node-c up, its GPUs not registered yet."""
    targets = [
        expr for _, title, expr in monitoring.dashboard_targets() if title == "GPU nodes by state"
    ]
    counts = [float(query(prometheus, grafana_expression(e))[0]["value"][1]) for e in targets]
    assert counts == [2.0, 1.0, 1.0]  # ready, not ready, no GPUs registered


def test_a_broken_expression_is_reported(prometheus: PrometheusServer) -> None:
    """Control: the harness does fail on PromQL that does not parse."""
    with pytest.raises(AssertionError, match="parse error"):
        query(prometheus, "sum(DCGM_FI_DEV_GPU_UTIL")
