"""The monitoring data files: dcgm-exporter's counters CSV, dashboards, adapter rules."""

from __future__ import annotations

import json
import re

from infra import monitoring

PROFILER_METRICS = {
    # The daemon's /metrics, from the profiler contract.
    "gpu_profiler_gpu_job_type",
    "gpu_profiler_gpu_period_seconds",
    "gpu_profiler_gpu_utilization_max_percent",
    "gpu_profiler_gpu_utilization_p95_percent",
    "gpu_profiler_gpu_idle_seconds",
    "gpu_profiler_cycle_duration_seconds_bucket",
    "gpu_profiler_errors_total",
    "gpu_profiler_last_success_timestamp_seconds",
}
REQUIRED_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
}
METRIC_NAME = re.compile(r"\b(DCGM_(?:FI|EXP)_\w+|gpu_profiler_\w+)\b")


def test_counters_csv_rows_have_field_type_and_help() -> None:
    rows = [
        line
        for line in monitoring.dcgm_counters_csv().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert rows
    for row in rows:
        field, kind, help_text = (part.strip() for part in row.split(",", 2))
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", field), row
        assert kind in {"gauge", "counter"}, row
        assert help_text, row
    fields = monitoring.dcgm_counter_fields()
    assert len(fields) == len(set(fields))
    assert set(fields) >= REQUIRED_FIELDS


def test_every_dcgm_metric_used_is_collected() -> None:
    """A query on a field the exporter does not collect would silently show nothing."""
    collected = set(monitoring.dcgm_counter_fields())
    texts = [expr for _, _, expr in monitoring.dashboard_targets()]
    texts += [r["expr"] for g in monitoring.prometheus_rules()["groups"] for r in g["rules"]]
    rules = monitoring.adapter_rules()
    texts += [r["seriesQuery"] for r in [*rules["custom"], *rules["external"]]]
    used = {name for text in texts for name in METRIC_NAME.findall(text)}
    assert {n for n in used if n.startswith("DCGM_")} <= collected
    assert {n for n in used if n.startswith("gpu_profiler_")} <= PROFILER_METRICS


def test_dashboards_have_unique_ids_and_panel_ids() -> None:
    uids = []
    for name, text in monitoring.dashboards().items():
        dashboard = json.loads(text)
        uids.append(dashboard["uid"])
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids)), name
        assert all(p["targets"] for p in dashboard["panels"] if p["type"] != "row"), name
        variables = {v["name"] for v in dashboard["templating"]["list"]}
        # Prometheus dashboards pick their data source; the history dashboard reads the store's.
        prometheus = any("expr" in t for p in dashboard["panels"] for t in p.get("targets", []))
        assert ({"datasource", "node"} if prometheus else {"node"}) <= variables, name
    assert len(uids) == len(set(uids))


def test_dcgm_dashboard_covers_the_required_panels() -> None:
    dashboard = json.loads(monitoring.dashboards()["gpu-dcgm-overview.json"])
    queried = {
        name
        for p in dashboard["panels"]
        for t in p.get("targets", [])
        for name in METRIC_NAME.findall(t["expr"])
    }
    assert queried >= {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_DEV_XID_ERRORS",
    }


def test_dcgm_dashboard_has_an_autoscaling_row() -> None:
    """Pending GPU pods, NodeClaims, GPU nodes by state, scaled replicas."""
    panels = json.loads(monitoring.dashboards()["gpu-dcgm-overview.json"])["panels"]
    (row,) = [p for p in panels if p["type"] == "row"]
    below = [p for p in panels if p["gridPos"]["y"] > row["gridPos"]["y"]]
    assert [p["title"] for p in below] == [
        "Pending GPU pods",
        "NodeClaims launched and terminated",
        "GPU nodes by state",
        "Scaled replicas",
    ]
    queried = " ".join(t["expr"] for p in below for t in p["targets"])
    for metric in (
        'kube_pod_status_phase{phase="Pending"}',
        "karpenter_nodeclaims_created_total",
        "karpenter_nodeclaims_terminated_total",
        "kube_node_status_condition",
        "kube_horizontalpodautoscaler_status_current_replicas",
    ):
        assert metric in queried
