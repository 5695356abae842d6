"""The values given to each chart exist in that chart, at the pinned version.

Test double for ``helm template``: key inventories of the charts' values.yaml at the pinned versions
(tests/infra/chart_values/, source commit in each file; see tests/infra/chart_keys.py). A version
bump in infra/versions.py without a new inventory fails here, so new versions get checked too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra import versions
from tests.infra.chart_keys import load_inventory, unknown_keys
from tests.infra.conftest import EKS_STACK
from infra.render.program import ProgramRun, run_stack

INVENTORIES = Path(__file__).parent / "chart_values"
GRAFANA_SUBCHART = "grafana-12.11.1"  # the version kube-prometheus-stack 88.5.3 depends on

# Keys the chart reads but documents only in comments of its values.yaml.
COMMENTED_KEYS = {
    # templates/metrics-configmap.yaml: `{{- if .Values.customMetrics }}`.
    "dcgm-exporter": {"customMetrics"},
    # templates/ingress.yaml: `{{- if .Values.ingress.ingressClassName }}`.
    "grafana": {"ingress.ingressClassName"},
}


def unknown(chart: str, values: dict[str, Any], inventory_name: str) -> list[str]:
    allowed = COMMENTED_KEYS.get(chart, set())
    return [key for key in unknown_keys(values, inventory(inventory_name)) if key not in allowed]


def inventory(name: str) -> dict[str, str]:
    path = INVENTORIES / f"{name}.json"
    assert path.exists(), f"no key inventory {path.name}: generate it (tests/infra/chart_keys.py)"
    return load_inventory(path)


def release_values(run: ProgramRun, chart: str) -> dict[str, Any]:
    values: dict[str, Any] = run.release(chart).inputs["values"]
    return values


@pytest.mark.parametrize(
    "chart",
    [versions.NVIDIA_DEVICE_PLUGIN, versions.DCGM_EXPORTER, versions.PROMETHEUS_ADAPTER],
    ids=lambda c: c.name,
)
def test_values_keys_exist_in_the_chart(eks_run: ProgramRun, chart: versions.HelmChart) -> None:
    values = release_values(eks_run, chart.name)
    assert unknown(chart.name, values, f"{chart.name}-{chart.version}") == []


def test_prometheus_stack_and_grafana_keys_exist(eks_run: ProgramRun) -> None:
    chart = versions.KUBE_PROMETHEUS_STACK
    values = release_values(eks_run, chart.name)
    own = {key: value for key, value in values.items() if key != "grafana"}
    assert unknown(chart.name, own, f"{chart.name}-{chart.version}") == []
    assert unknown("grafana", values["grafana"], GRAFANA_SUBCHART) == []


def test_grafana_ingress_keys_exist() -> None:
    run = run_stack(EKS_STACK, overrides={"grafanaIngressHost": "grafana.example.org"})
    grafana = release_values(run, versions.KUBE_PROMETHEUS_STACK.name)["grafana"]
    assert grafana["ingress"]["enabled"] is True
    assert unknown("grafana", grafana, GRAFANA_SUBCHART) == []


def test_a_misspelt_key_is_caught(eks_run: ProgramRun) -> None:
    """Control: the check does report keys a chart does not have."""
    values = release_values(eks_run, versions.DCGM_EXPORTER.name)
    broken = {**values, "serviceMonitor": {**values["serviceMonitor"], "honourLabels": True}}
    del broken["customMetrics"]
    chart = versions.DCGM_EXPORTER
    assert unknown_keys(broken, inventory(f"{chart.name}-{chart.version}")) == [
        "serviceMonitor.honourLabels"
    ]
