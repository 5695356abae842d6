"""Scenarios for `promtool test rules`: each alert firing and not firing, each recording rule.

``render()`` writes them as promtool's unit-test YAML, tests/infra/promtool/gpu-rules.test.yaml;
regenerate it with ``python -m tests.infra.promtool_cases > <that file>``.
Expected annotations are the rule's templates with ``$labels``/``$value`` filled in here; promtool,
which renders them with Prometheus' own template engine, is the judge of whether that is right.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra import monitoring

RULES_FROM_TEST_FILE = "../../../infra/monitoring/rules.yaml"
_TEMPLATE = re.compile(r"\{\{\s*(\$labels\.(\w+)|\$value)\s*\}\}")

A0 = {"Hostname": "node-a", "gpu": "0", "UUID": "GPU-a0"}
# kube-state-metrics' label of a GPU node (the platform allows it through metricLabelsAllowlist).
GPU_NODE = {"label_nvidia_com_gpu_present": "true"}
A1 = {"Hostname": "node-a", "gpu": "1", "UUID": "GPU-a1"}
B0 = {"Hostname": "node-b", "gpu": "0", "UUID": "GPU-b0"}
# A time-sliced GPU under dcgm-exporter 4.5.3+ with virtual GPUs that cannot map processes to pods:
# the device series, and per pod a GPU_UTIL series of 0 without pod_uid
# (tests/infra/promtool_scaling.py has every shape, with its upstream source).
B1 = {"Hostname": "node-b", "gpu": "1", "UUID": "GPU-b1"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    label_text = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{label_text}}}", "values": values}


ML = {"namespace": "ml"}


def gpu_pod(pod: str, gpus: int, phases: str) -> list[dict[str, str]]:
    """A pod's GPU request and its phase over time: ``"Pending x5, Running x35"`` (in steps)."""
    labels = {**ML, "pod": pod}
    request = {**labels, "container": "main", "resource": "nvidia_com_gpu", "unit": "integer"}
    spans = [part.split(" x") for part in phases.split(", ")]
    steps = sum(int(count) for _, count in spans)
    result = [series("kube_pod_container_resource_requests", request, f"{gpus}x{steps}")]
    for phase in ("Pending", "Running"):
        values = " ".join(f"{int(name == phase)}x{count}" for name, count in spans)
        result.append(series("kube_pod_status_phase", {**labels, "phase": phase}, values))
    return result


@dataclass
class Firing:
    """An alert expected at ``eval_time`` with these labels and ``$value``."""

    labels: dict[str, str]
    value: float | None = None


@dataclass
class AlertCase:
    alert: str
    input_series: list[dict[str, str]]
    quiet_at: str  # nothing fires (or it is still pending)
    firing_at: str
    firing: list[Firing]
    interval: str = "1m"
    resolved_at: str | None = None  # quiet again once the condition has passed
    name: str | None = None  # the promtool test's name, when an alert has several cases


@dataclass
class RecordingCase:
    input_series: list[dict[str, str]]
    checks: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = field(default_factory=list)


ALERT_CASES = [
    AlertCase(
        "GpuXidError",
        [
            # The last-XID gauge stays at 79; the windowed count falls back to 0 after 5 minutes.
            series("DCGM_FI_DEV_XID_ERRORS", A0, "0x4 79x20"),
            series("DCGM_EXP_XID_ERRORS_COUNT", {**A0, "xid": "79"}, "0x4 2x5 0x10"),
            series("DCGM_EXP_XID_ERRORS_COUNT", {**A1, "xid": "13"}, "0x20"),
        ],
        quiet_at="2m",
        firing_at="7m",
        firing=[Firing({**A0, "xid": "79"}, 2)],
        resolved_at="15m",
    ),
    AlertCase(
        "GpuTemperatureHigh",
        [
            series("DCGM_FI_DEV_GPU_TEMP", A0, "70x5 90x15"),
            series("DCGM_FI_DEV_GPU_TEMP", A1, "84x20"),
        ],
        quiet_at="8m",  # hot since 6m: still pending
        firing_at="14m",
        firing=[Firing(A0, 90)],
    ),
    AlertCase(
        "GpuDoubleBitEccErrors",
        [
            series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", A0, "0x10 1x10"),
            series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", A1, "3x20"),  # old errors, none new
        ],
        quiet_at="5m",
        firing_at="12m",
        firing=[Firing(A0)],
    ),
    AlertCase(
        "GpuRowRemapFailure",
        [
            series("DCGM_FI_DEV_ROW_REMAP_FAILURE", A0, "0x5 1x5"),
            series("DCGM_FI_DEV_ROW_REMAP_FAILURE", A1, "0x10"),
        ],
        quiet_at="3m",
        firing_at="7m",
        firing=[Firing(A0)],
    ),
    AlertCase(
        "GpuUncorrectableRowsRemapped",
        [
            series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", A0, "0x10 2x10"),
            series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", A1, "0x20"),
        ],
        quiet_at="5m",
        firing_at="15m",
        firing=[Firing(A0)],
    ),
    AlertCase(
        "DcgmExporterDown",
        [
            series("up", {"job": "dcgm-exporter", "instance": "10.0.1.5:9400"}, "1x5 0x15"),
            series("up", {"job": "dcgm-exporter", "instance": "10.0.1.6:9400"}, "1x20"),
        ],
        quiet_at="8m",
        firing_at="14m",
        firing=[Firing({"job": "dcgm-exporter", "instance": "10.0.1.5:9400"})],
    ),
    AlertCase(
        "DcgmExporterAbsent",
        [
            series("up", {"job": "kube-state-metrics", "instance": "10.0.2.1:8080"}, "1x30"),
            series("kube_node_labels", {"node": "cpu-1"}, "1x30"),
            series("kube_node_labels", {"node": "gpu-1", **GPU_NODE}, "1x30"),
        ],
        quiet_at="10m",
        firing_at="20m",
        firing=[Firing({"job": "dcgm-exporter"})],
    ),
    AlertCase(  # Karpenter scaled the GPU nodes to zero: no exporter is expected
        "DcgmExporterAbsent",
        [
            series("up", {"job": "kube-state-metrics", "instance": "10.0.2.1:8080"}, "1x40"),
            series("kube_node_labels", {"node": "cpu-1"}, "1x40"),
            # A GPU node until minute 5, then none; a GPU node again from minute 25 (no exporter).
            series("kube_node_labels", {"node": "gpu-1", **GPU_NODE}, "1x5 _x35"),
            series("kube_node_labels", {"node": "gpu-2", **GPU_NODE}, "_x25 1x15"),
        ],
        quiet_at="22m",
        firing_at="41m",
        firing=[Firing({"job": "dcgm-exporter"})],
        name="DcgmExporterAbsent, GPU nodes scaled to zero and back",
    ),
    AlertCase(
        "GpuProfilerDown",
        [
            series("up", {"job": "gpu-profiler", "instance": "10.0.1.5:9401"}, "1x2 0x20"),
            series("up", {"job": "gpu-profiler", "instance": "10.0.1.6:9401"}, "1x22"),
        ],
        quiet_at="8m",
        firing_at="15m",
        firing=[Firing({"job": "gpu-profiler", "instance": "10.0.1.5:9401"})],
    ),
    AlertCase(
        "GpuProfilerFailing",
        [
            # Last success at time 0 and never again; the other daemon succeeds every minute.
            series(
                "gpu_profiler_last_success_timestamp_seconds",
                {"job": "gpu-profiler", "instance": "10.0.1.5:9401"},
                "0x40",
            ),
            series(
                "gpu_profiler_last_success_timestamp_seconds",
                {"job": "gpu-profiler", "instance": "10.0.1.6:9401"},
                "0+60x40",
            ),
        ],
        quiet_at="17m",
        firing_at="25m",
        firing=[Firing({"job": "gpu-profiler", "instance": "10.0.1.5:9401"})],
    ),
    AlertCase(
        "GpuPodPending",
        [
            # ml/train-0 waits 25 minutes for 2 GPUs; ml/infer-0 waits 5 minutes for its node, then
            # runs; a CPU pod pending for ever is none of this alert's business.
            *gpu_pod("train-0", gpus=2, phases="Pending x25, Running x15"),
            *gpu_pod("infer-0", gpus=1, phases="Pending x5, Running x35"),
            series("kube_pod_status_phase", {**ML, "pod": "web-0", "phase": "Pending"}, "1x40"),
            series(
                "kube_pod_container_resource_requests",
                {**ML, "pod": "web-0", "container": "main", "resource": "cpu", "unit": "core"},
                "1x40",
            ),
        ],
        quiet_at="10m",  # pending since 0: still within the 15 minutes
        firing_at="20m",
        firing=[Firing({**ML, "pod": "train-0"}, 2)],
        resolved_at="35m",  # it got its node
    ),
    AlertCase(
        "GpuAllocatedButIdle",
        [
            # Busy for 30 minutes, then idle; the trainer stays busy; B0 is idle but unallocated.
            series(
                "DCGM_FI_DEV_GPU_UTIL",
                {**A0, "namespace": "ml", "pod": "notebook-0"},
                "50x30 0x170",
            ),
            series("DCGM_FI_DEV_GPU_UTIL", {**A1, "namespace": "ml", "pod": "trainer-0"}, "80x200"),
            series("DCGM_FI_DEV_GPU_UTIL", B0, "0x200"),
            # Busy on a shared GPU whose exporter reads its pods 0: not idle.
            series("DCGM_FI_DEV_GPU_UTIL", B1, "70x200"),
            series(
                "DCGM_FI_DEV_GPU_UTIL",
                {**B1, "namespace": "ml", "pod": "llm-0", "vgpu": "0"},
                "0x200",
            ),
        ],
        quiet_at="140m",  # idle for 1h50m: condition true since 91m, pending
        firing_at="160m",
        firing=[Firing({**A0, "namespace": "ml", "pod": "notebook-0"}, 0)],
    ),
    AlertCase(
        "GpuProfilerIdleAllocatedGpu",
        [
            series(
                "gpu_profiler_gpu_job_type",
                {**A0, "namespace": "ml", "pod": "notebook-0", "job_type": "idle"},
                "1x200",
            ),
            series(
                "gpu_profiler_gpu_job_type",
                {**A1, "namespace": "ml", "pod": "trainer-0", "job_type": "idle"},
                "0x200",
            ),
            series(
                "gpu_profiler_gpu_job_type",
                {**B0, "namespace": "", "pod": "", "job_type": "idle"},
                "1x200",
            ),
        ],
        quiet_at="100m",
        firing_at="130m",
        firing=[Firing({**A0, "namespace": "ml", "pod": "notebook-0", "job_type": "idle"})],
    ),
]

RECORDING_CASE = RecordingCase(
    input_series=[
        series("DCGM_FI_DEV_GPU_UTIL", {**A0, "namespace": "ml", "pod": "trainer-0"}, "90x10"),
        series("DCGM_FI_DEV_GPU_UTIL", {**A1, "namespace": "ml", "pod": "trainer-0"}, "60x10"),
        series("DCGM_FI_DEV_GPU_UTIL", B0, "0x10"),
        series("DCGM_FI_DEV_GPU_UTIL", B1, "40x10"),
        series("DCGM_FI_DEV_GPU_UTIL", {**B1, **ML, "pod": "nb-0", "vgpu": "0"}, "0x10"),
        series("DCGM_FI_DEV_GPU_UTIL", {**B1, **ML, "pod": "nb-1", "vgpu": "1"}, "0x10"),
        series(
            "kube_pod_container_resource_requests",
            {
                "namespace": "ml",
                "pod": "trainer-0",
                "container": "main",
                "resource": "nvidia_com_gpu",
                "unit": "integer",
            },
            "2x10",
        ),
        series(
            "kube_pod_container_resource_requests",
            {
                "namespace": "ml",
                "pod": "done-0",
                "container": "main",
                "resource": "nvidia_com_gpu",
                "unit": "integer",
            },
            "1x10",
        ),
        series(
            "kube_pod_status_phase",
            {"namespace": "ml", "pod": "trainer-0", "phase": "Running"},
            "1x10",
        ),
        series(
            "kube_pod_status_phase",
            {"namespace": "ml", "pod": "done-0", "phase": "Running"},
            "0x10",
        ),
        series(
            "kube_pod_status_phase",
            {"namespace": "ml", "pod": "done-0", "phase": "Succeeded"},
            "1x10",
        ),
        series("gpu_profiler_gpu_job_type", {**A0, "job_type": "idle"}, "0x10"),
        series("gpu_profiler_gpu_job_type", {**A0, "job_type": "training"}, "1x10"),
        series("gpu_profiler_gpu_job_type", {**B0, "job_type": "idle"}, "1x10"),
        series("gpu_profiler_gpu_job_type", {**B0, "job_type": "training"}, "0x10"),
    ],
    checks=[
        ("5m", "cluster:gpu_utilization:avg", [({}, 47.5)]),  # A0, A1, B0, B1 once each
        (
            "5m",
            "namespace_pod:gpu_utilization:avg",
            [
                ({"namespace": "ml", "pod": "trainer-0"}, 75),
                ({"namespace": "ml", "pod": "nb-0"}, 40),
                ({"namespace": "ml", "pod": "nb-1"}, 40),
            ],
        ),
        ("5m", "cluster:gpu_requested:sum", [({}, 2)]),
        ("5m", "cluster:gpu_profiler_idle_gpus:count", [({}, 1)]),
    ],
)


def _go_value(value: float) -> str:
    # Prometheus prints $value with Go's %v (shortest representation, no trailing ".0").
    return f"{value:g}"


def expand(template: str, labels: dict[str, str], value: float | None) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group(2):
            return labels.get(match.group(2), "")
        if value is None:
            raise ValueError(f"template uses $value but the case gives none: {template!r}")
        return _go_value(value)

    return _TEMPLATE.sub(substitute, template)


def alert_rules() -> dict[str, dict[str, Any]]:
    return {
        rule["alert"]: rule
        for group in monitoring.prometheus_rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def _expected_alert(rule: dict[str, Any], firing: Firing) -> dict[str, Any]:
    labels = {**firing.labels, **rule["labels"]}
    return {
        "exp_labels": labels,
        "exp_annotations": {
            key: expand(text, firing.labels, firing.value)
            for key, text in rule["annotations"].items()
        },
    }


def unit_test_document() -> dict[str, Any]:
    """The promtool unit-test document for all cases."""
    rules = alert_rules()
    tests: list[dict[str, Any]] = []
    for case in ALERT_CASES:
        rule = rules[case.alert]
        tests.append(
            {
                "name": case.name or case.alert,
                "interval": case.interval,
                "input_series": case.input_series,
                "alert_rule_test": [
                    {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
                    {
                        "eval_time": case.firing_at,
                        "alertname": case.alert,
                        "exp_alerts": [_expected_alert(rule, f) for f in case.firing],
                    },
                    *(
                        [{"eval_time": case.resolved_at, "alertname": case.alert, "exp_alerts": []}]
                        if case.resolved_at
                        else []
                    ),
                ],
            }
        )
    tests.append(
        {
            "name": "recording rules",
            "interval": "1m",
            "input_series": RECORDING_CASE.input_series,
            "promql_expr_test": [
                {
                    "expr": expr,
                    "eval_time": at,
                    "exp_samples": [
                        {
                            "labels": expr_labels(expr, labels),
                            "value": value,
                        }
                        for labels, value in samples
                    ],
                }
                for at, expr, samples in RECORDING_CASE.checks
            ],
        }
    )
    return {"rule_files": [RULES_FROM_TEST_FILE], "evaluation_interval": "1m", "tests": tests}


def expr_labels(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return f"{name}{{{inner}}}" if inner else name


class _IndentedDumper(yaml.SafeDumper):
    """Indents list items under their key, as yamllint's default indentation rule wants."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def render() -> str:
    header = (
        "# Generated by tests/infra/promtool_cases.py; edit the cases there and regenerate:\n"
        "#   python -m tests.infra.promtool_cases > tests/infra/promtool/gpu-rules.test.yaml\n"
    )
    body = yaml.dump(
        unit_test_document(),
        Dumper=_IndentedDumper,
        sort_keys=False,
        width=1000,
        allow_unicode=True,
    )
    return header + body


if __name__ == "__main__":
    print(render(), end="")
