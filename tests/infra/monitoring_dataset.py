"""A small cluster's worth of series for running the shipped PromQL against a real Prometheus.

Two nodes with two GPUs each, three hours at 30 s, ending now:

- node-a GPU 0: ml/trainer-0, training (periodic load), period 120 s;
- node-a GPU 1: ml/notebook-0, allocated but idle;
- node-b GPU 0: unallocated, idle, and faulty (XID 79 in the last minutes, new double-bit ECC
  errors, remapped rows, a failed row remap);
- node-b GPU 1: inference/llm-server-7c9d8b6f5-x2x7q (a pod of the example Deployment
  llm-server), steady load, running hot (90 °C).

Plus what kube-state-metrics, the scrape (``up``) and gpu-profiler's /metrics add, and a cluster
scaling up: ml/trainer-1 pending for a GPU for 20 minutes, Karpenter launching NodeClaims, its
new node-c not ready yet (no GPUs registered), KEDA's HPA of the example workload. node-b's
dcgm-exporter and gpu-profiler targets are down for the last 10 minutes and its profiler's last
success is an hour old, so that every health alert's expression has something to return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from infra import monitoring
from tests.support.dcgm import OpenMetricsBuilder, sample_times

STEP_SECONDS = 30.0
POINTS = 360  # three hours
JOB_TYPES = ("idle", "training", "inference", "bursty")


@dataclass(frozen=True)
class DatasetGpu:
    hostname: str
    index: int
    namespace: str
    pod: str
    job_type: str

    @property
    def labels(self) -> dict[str, str]:
        labels = {
            "gpu": str(self.index),
            "UUID": f"GPU-{self.hostname}-{self.index}",
            "device": f"nvidia{self.index}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": self.hostname,
        }
        if self.pod:
            labels.update(namespace=self.namespace, pod=self.pod, container="main")
        return labels


GPUS = (
    DatasetGpu("node-a", 0, "ml", "trainer-0", "training"),
    DatasetGpu("node-a", 1, "ml", "notebook-0", "idle"),
    DatasetGpu("node-b", 0, "", "", "idle"),
    DatasetGpu("node-b", 1, "inference", "llm-server-7c9d8b6f5-x2x7q", "inference"),
)
INSTANCES = {"node-a": "10.0.1.5", "node-b": "10.0.1.6"}
FAULTY = ("node-b", 0)
HOT = ("node-b", 1)


def _utilisation(gpu: DatasetGpu, times: np.ndarray) -> np.ndarray:
    if gpu.job_type == "training":
        return np.where((times % 120) < 90, 95.0, 5.0)
    if gpu.job_type == "inference":
        return np.full(times.shape, 40.0)
    return np.zeros(times.shape)


def _step(times: np.ndarray, at: float, before: float, after: float) -> np.ndarray:
    return np.where(times < at, before, after)


def _add_autoscaling(
    add: Callable[[str, dict[str, str], np.ndarray | float], None], times: np.ndarray
) -> None:
    """kube-state-metrics' and Karpenter's series of a cluster that is scaling up."""
    # ml/trainer-1 has waited the last 20 minutes for a GPU; Karpenter's node-c for it is up but
    # its device plugin has not registered nvidia.com/gpu yet (so it is not ready either).
    last = float(times[-1])
    pending = {"namespace": "ml", "pod": "trainer-1"}
    waiting = _step(times, last - 1200, 0, 1)
    add("kube_pod_status_phase", {**pending, "phase": "Pending"}, waiting)
    request = {**pending, "container": "main", "resource": "nvidia_com_gpu", "unit": "integer"}
    add("kube_pod_container_resource_requests", request, 1.0)
    for node in (*INSTANCES, "node-c"):
        new = node == "node-c"
        labels = {"node": node, "label_nvidia_com_gpu_present": "true"}
        if new:
            labels["label_karpenter_sh_nodepool"] = "gpu"
        add("kube_node_labels", labels, 1.0)
        for status in ("true", "false", "unknown"):
            ready = (status == "false") if new else (status == "true")
            condition = {"node": node, "condition": "Ready", "status": status}
            add("kube_node_status_condition", condition, float(ready))
        if not new:
            allocatable = {"node": node, "resource": "nvidia_com_gpu", "unit": "integer"}
            add("kube_node_status_allocatable", allocatable, 2.0)
    launches = np.cumsum(times >= last - 900)  # one NodeClaim a step for the last 15 minutes
    claim = {"nodepool": "gpu", "instance": "10.0.0.9:8080", "job": "karpenter"}
    add("karpenter_nodeclaims_created_total", {**claim, "reason": "provisioning"}, launches)
    add("karpenter_nodeclaims_terminated_total", claim, launches // 2)
    hpa = {"namespace": "inference", "horizontalpodautoscaler": "keda-hpa-llm-server"}
    add("kube_horizontalpodautoscaler_status_current_replicas", hpa, 1.0)
    add("kube_horizontalpodautoscaler_status_desired_replicas", hpa, 2.0)
    add("kube_horizontalpodautoscaler_spec_max_replicas", hpa, 4.0)


def build(end: float | None = None) -> str:
    """The dataset as OpenMetrics text for ``PrometheusServer``."""
    times = sample_times(POINTS, STEP_SECONDS, end)
    last = float(times[-1])
    builder = OpenMetricsBuilder()

    def add(name: str, labels: dict[str, str], values: np.ndarray | float) -> None:
        array = np.broadcast_to(np.asarray(values, dtype=np.float64), times.shape)
        builder.add(name, labels, array, times)  # counters too: PromQL does not care

    for gpu in GPUS:
        labels = gpu.labels
        key = (gpu.hostname, gpu.index)
        util = _utilisation(gpu, times)
        fb_used = 40000.0 if gpu.pod else 0.0
        faulty = key == FAULTY
        fields: dict[str, np.ndarray | float] = {
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": util / 2,
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_FREE": 81559.0 - fb_used,
            "DCGM_FI_DEV_GPU_TEMP": 90.0 if key == HOT else 55.0 + util / 10,
            "DCGM_FI_DEV_MEMORY_TEMP": 50.0,
            "DCGM_FI_DEV_POWER_USAGE": 70.0 + 5 * util,
            "DCGM_FI_DEV_XID_ERRORS": 79.0 if faulty else 0.0,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": np.arange(POINTS) // 60,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _step(times, last - 300, 0, 1) if faulty else 0.0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
                _step(times, last - 1800, 0, 2) if faulty else 0.0
            ),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1.0 if faulty else 0.0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": util / 100,
            "DCGM_FI_PROF_SM_ACTIVE": util / 100,
            "DCGM_FI_PROF_SM_OCCUPANCY": util / 200,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": util / 150,
            "DCGM_FI_PROF_DRAM_ACTIVE": util / 300,
        }
        scrape = {"instance": f"{INSTANCES[gpu.hostname]}:9400", "job": "dcgm-exporter"}
        for name, values in fields.items():
            add(name, {**labels, **scrape}, values)
        # The exporter's XID count has a series per XID seen in its window.
        xid_count = "DCGM_EXP_XID_ERRORS_COUNT"
        if faulty:
            add(xid_count, {**labels, **scrape, "xid": "79"}, _step(times, last - 120, 0, 1))
        assert {*fields, xid_count} == set(monitoring.dcgm_counter_fields())

        profiler_labels = {
            "Hostname": gpu.hostname,
            "gpu": str(gpu.index),
            "UUID": labels["UUID"],
            "namespace": gpu.namespace,
            "pod": gpu.pod,
            "instance": f"{INSTANCES[gpu.hostname]}:9401",
            "job": "gpu-profiler",
        }
        for job_type in JOB_TYPES:
            add(
                "gpu_profiler_gpu_job_type",
                {**profiler_labels, "job_type": job_type},
                1.0 if job_type == gpu.job_type else 0.0,
            )
        if gpu.job_type == "training":
            add("gpu_profiler_gpu_period_seconds", profiler_labels, 120.0)
        add("gpu_profiler_gpu_utilization_max_percent", profiler_labels, float(util.max()))
        add("gpu_profiler_gpu_utilization_p95_percent", profiler_labels, float(util.max()))
        add(
            "gpu_profiler_gpu_idle_seconds",
            profiler_labels,
            1800.0 if gpu.job_type == "idle" else 0.0,
        )

        if gpu.pod:
            pod = {"namespace": gpu.namespace, "pod": gpu.pod}
            add(
                "kube_pod_container_resource_requests",
                {
                    **pod,
                    "container": "main",
                    "node": gpu.hostname,
                    "resource": "nvidia_com_gpu",
                    "unit": "integer",
                },
                1.0,
            )
            add("kube_pod_status_phase", {**pod, "phase": "Running"}, 1.0)

    _add_autoscaling(add, times)
    for hostname, address in INSTANCES.items():
        down = hostname == "node-b"
        for job, port in (("dcgm-exporter", 9400), ("gpu-profiler", 9401)):
            up = _step(times, last - 600, 1, 0) if down else 1.0
            add("up", {"instance": f"{address}:{port}", "job": job}, up)
        profiler = {"instance": f"{address}:9401", "job": "gpu-profiler"}
        add(
            "gpu_profiler_last_success_timestamp_seconds",
            profiler,
            np.minimum(times, last - 3600) if down else times,
        )
        cycles = np.arange(1, POINTS + 1, dtype=np.float64)
        add("gpu_profiler_errors_total", {**profiler, "kind": "source"}, cycles if down else 0.0)
        for le, share in (("0.1", 0.5), ("0.5", 0.9), ("1", 1.0), ("+Inf", 1.0)):
            add(
                "gpu_profiler_cycle_duration_seconds_bucket", {**profiler, "le": le}, cycles * share
            )
        add("gpu_profiler_cycle_duration_seconds_count", profiler, cycles)
        add("gpu_profiler_cycle_duration_seconds_sum", profiler, cycles * 0.2)
    return builder.text()
