"""Monitoring content shipped with the GPU platform: data files plus their loaders.

- ``dcgm-counters.csv``: the fields dcgm-exporter collects (its ``customMetrics`` value);
- ``rules.yaml``: recording and alerting rules (a PrometheusRule spec; a promtool rule file);
- ``adapter-rules.yaml``: prometheus-adapter's custom and external metric rules;
- ``dashboards/*.json``: Grafana dashboards, shipped as labelled ConfigMaps.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import yaml

_PACKAGE = resources.files(__name__)

DCGM_COUNTERS_FILE = "dcgm-counters.csv"
RULES_FILE = "rules.yaml"
ADAPTER_RULES_FILE = "adapter-rules.yaml"
# The custom metric (pods/gpu_utilization) both workload scalers read: the HPA through
# prometheus-adapter, KEDA through the same rule's query (workload_gpu_utilization_query).
GPU_UTILIZATION_METRIC = "gpu_utilization"


def _text(name: str) -> str:
    return _PACKAGE.joinpath(name).read_text(encoding="utf-8")


def dcgm_counters_csv() -> str:
    """The counters CSV for dcgm-exporter."""
    return _text(DCGM_COUNTERS_FILE)


def dcgm_counter_fields() -> list[str]:
    """The DCGM field names the counters CSV enables."""
    fields = []
    for line in dcgm_counters_csv().splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            fields.append(stripped.split(",", 1)[0].strip())
    return fields


def prometheus_rules() -> dict[str, Any]:
    """The rule groups, as the ``spec`` of a PrometheusRule."""
    spec: dict[str, Any] = yaml.safe_load(_text(RULES_FILE))
    return spec


def adapter_rules() -> dict[str, Any]:
    """prometheus-adapter rules: ``{"custom": [...], "external": [...]}``."""
    rules: dict[str, Any] = yaml.safe_load(_text(ADAPTER_RULES_FILE))
    return rules


def adapter_rule(metric: str) -> dict[str, Any]:
    """The adapter's custom (per-pod) rule that serves ``metric``."""
    for rule in adapter_rules()["custom"]:
        if rule["name"]["as"] == metric:
            found: dict[str, Any] = rule
            return found
    raise LookupError(f"no prometheus-adapter rule serves {metric}")


def adapter_metrics_query(rule: dict[str, Any], label_matchers: str, group_by: str) -> str:
    """A rule's metricsQuery as prometheus-adapter fills it in: ``<<.Series>>`` the series of its
    seriesQuery, ``<<.LabelMatchers>>`` the requested objects' matchers (``namespace="ml",
    pod=~"a|b"``; empty for an external metric without a selector), ``<<.GroupBy>>`` their labels.
    """
    series = re.match(r"\w+", rule["seriesQuery"].strip("'\""))
    if series is None:
        raise ValueError(f"adapter rule {rule['name']['as']}: no series in its seriesQuery")
    return str(
        rule["metricsQuery"]
        .replace("<<.Series>>", series.group(0))
        .replace("<<.LabelMatchers>>", label_matchers)
        .replace("<<.GroupBy>>", group_by)
    )


def workload_gpu_utilization_query(namespace: str, pod_pattern: str) -> str:
    """The sum over a workload's pods of each pod's ``gpu_utilization``, as the adapter computes
    it: the rule's metricsQuery for those pods, grouped by pod as the adapter groups it.

    KEDA divides the sum by the replicas (AverageValue), which gives the HPA's per-pod average.
    """
    rule = adapter_rule(GPU_UTILIZATION_METRIC)
    matchers = f'namespace="{namespace}",pod=~"{pod_pattern}"'
    return f"sum({adapter_metrics_query(rule, matchers, 'namespace, pod')})"


def dashboards() -> dict[str, str]:
    """Grafana dashboards by file name, as JSON text."""
    folder = _PACKAGE.joinpath("dashboards")
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".json")
    }


def dashboard_targets() -> list[tuple[str, str, str]]:
    """``(dashboard file, panel title, PromQL)`` for every Prometheus target of every dashboard
    (panels on the profiler's store carry SQL, ``rawSql``, instead)."""
    targets = []
    for name, text in dashboards().items():
        for panel in json.loads(text)["panels"]:
            for target in panel.get("targets", []):
                if "expr" in target:
                    targets.append((name, panel["title"], target["expr"]))
    return targets
