"""The scaling metrics in every dcgm-exporter series shape, for `promtool test rules`.

prometheus-adapter's ``gpu_utilization`` and ``gpu_framebuffer_used_mebibytes`` (per pod),
``gpu_utilization_cluster_average`` (external) and the KEDA trigger's query are evaluated, as
shipped in infra/monitoring/adapter-rules.yaml (with the adapter's template filled in as it fills
it), on the series each exporter shape sends for one node:

- GPU 0, time-sliced: ``llm-0`` (namespace ``inference``) busy, ``notebook-0`` (``ml``) idle;
- GPU 1, whole: ``trainer-0`` (``ml``) busy;
- GPU 2: no pod.

The shapes, read line by line in NVIDIA/dcgm-exporter (no exporter ran here; these are the series
that code writes, in its text format, before Prometheus drops empty labels):

- ``classic``: without ``KUBERNETES_VIRTUAL_GPUS``, any release (tag 4.5.3-4.8.2,
  internal/pkg/transformation/kubernetes.go, ``Process`` after "KubernetesVirtualGPUs is
  disabled"; ``toDeviceToPod``): the device series of a GPU held by a pod gains that pod's
  ``pod``/``namespace``/``container``; on a time-sliced GPU one map entry per device id wins, so
  one pod is named (``llm-0`` here) and the other is invisible.
- ``copies``: with virtual GPUs before 4.5.3 (tag 4.5.2-4.8.1, kubernetes.go ``Process``, the
  ``KubernetesVirtualGPUs`` branch): every field's device series is replaced by one copy per pod
  with ``pod``, ``namespace``, ``container``, ``pod_uid`` (empty without the API token) and
  ``vgpu`` (the ``::N`` of a replica's device id, ``getSharedGPU``); once any GPU has a pod, the
  series of GPUs without one are dropped (``metrics[counter] = newmetrics``).
- ``per-pod, UIDs off``: with virtual GPUs from 4.5.3 (tag 4.5.3-4.8.2), the chart's defaults
  (no token, no ``hostPID``): GPU_UTIL and FB_USED keep the device series (kubernetes.go,
  "original device-level metric") and add one series per pod (``createPerProcessMetrics``) whose
  value is 0, ``buildIdlePodValues``, as no process maps to a pod (pidmapper.go), and whose
  ``pod_uid`` is empty; every other field is copied per pod as before, without ``pod_uid``
  (``KubernetesEnablePodUID`` off); GPUs without pods keep their device series.
- ``per-pod, UIDs on``: the same release with ``hostPID`` and ``kubernetes.enablePodUID`` (how
  the stacks run it where GPUs are shared): the per-pod GPU_UTIL/FB_USED series carry
  ``pod_uid`` and the pod's own figures (NVML's per-process accounting, process_metrics.go);
  the copies of other fields carry ``pod_uid`` too.

Each shape is also sent with ``hostname`` in place of ``Hostname`` (NVIDIA/dcgm-exporter main,
commit d5e5f51, "Rename Hostname label to hostname"): the queries join on ``UUID``, not the node.

Regenerate the promtool file with
``python -m tests.infra.promtool_scaling > tests/infra/promtool/gpu-scaling.test.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from infra import monitoring
from tests.infra.promtool_cases import _IndentedDumper

STEPS = "x10"
EVAL_TIME = "5m"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB = "DCGM_FI_DEV_FB_USED"
POWER = "DCGM_FI_DEV_POWER_USAGE"


@dataclass(frozen=True)
class Gpu:
    index: int
    util: float  # the device's figures
    fb: float
    power: float


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    gpu: int
    vgpu: str | None  # the replica of a time-sliced GPU ("::N" of the device id)
    util: float  # the pod's own figures (NVML's per-process accounting)
    fb: float


GPUS = (Gpu(0, 70, 30000, 250), Gpu(1, 92, 40000, 300), Gpu(2, 0, 0, 60))
LLM = Pod("inference", "llm-0", "7c1e2a4e-0000-4000-8000-000000000001", 0, "0", 60, 20000)
NOTEBOOK = Pod("ml", "notebook-0", "7c1e2a4e-0000-4000-8000-000000000002", 0, "1", 0, 10000)
TRAINER = Pod("ml", "trainer-0", "7c1e2a4e-0000-4000-8000-000000000003", 1, None, 92, 40000)
PODS = (LLM, NOTEBOOK, TRAINER)
SHAPES = ("classic", "copies", "per-pod, UIDs off", "per-pod, UIDs on")


def device_labels(gpu: Gpu, node_label: str) -> dict[str, str]:
    """render_metrics.go's labels of a GPU series (tag 4.5.3-4.8.2, gpuMetricsFormat)."""
    return {
        "gpu": str(gpu.index),
        "UUID": f"GPU-a0b1c2d3-0000-4000-8000-00000000000{gpu.index}",
        "pci_bus_id": f"00000000:{16 + gpu.index:02X}:00.0",
        "device": f"nvidia{gpu.index}",
        "modelName": "NVIDIA A10G",
        node_label: "node-a",
    }


def pod_labels(pod: Pod, uid: str) -> dict[str, str]:
    labels = {"pod": pod.name, "namespace": pod.namespace, "container": "main", "pod_uid": uid}
    if pod.vgpu is not None:
        labels["vgpu"] = pod.vgpu
    return labels


def text(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
    inner = ",".join(f'{key}="{val}"' for key, val in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": f"{value:g}{STEPS}"}


def exporter_series(shape: str, node_label: str) -> list[dict[str, str]]:
    """What Prometheus scrapes from the node in ``shape`` (module docstring)."""
    uids_on = shape == "per-pod, UIDs on"
    out: list[dict[str, str]] = []
    for gpu in GPUS:
        device = device_labels(gpu, node_label)
        pods = [pod for pod in PODS if pod.gpu == gpu.index]
        for field, value in ((UTIL, gpu.util), (FB, gpu.fb), (POWER, gpu.power)):
            if shape == "classic":
                labels = dict(device)
                if pods:  # one pod named per device id
                    labels |= {"pod": pods[0].name, "namespace": pods[0].namespace}
                    labels["container"] = "main"
                out.append(text(field, labels, value))
            elif shape == "copies":
                out += [text(field, {**device, **pod_labels(pod, "")}, value) for pod in pods]
            else:
                per_process = field in (UTIL, FB)
                if per_process or not pods:
                    out.append(text(field, device, value))  # the device series stays
                for pod in pods:
                    labels = {**device, **pod_labels(pod, pod.uid if uids_on else "")}
                    own = (pod.util if field == UTIL else pod.fb) if uids_on else 0
                    out.append(text(field, labels, own if per_process else value))
    return out


def expected(shape: str, metric: str) -> dict[str, float]:
    """Each pod's value of a per-pod metric (``util`` or ``fb``) in ``shape``."""
    gpus = {gpu.index: gpu for gpu in GPUS}
    values = {}
    for pod in PODS:
        if shape == "classic" and pod is NOTEBOOK:
            continue  # the exporter names one pod of the time-sliced GPU
        if shape == "per-pod, UIDs on":
            values[pod.name] = pod.util if metric == "util" else pod.fb
        else:  # the device's figure
            values[pod.name] = gpus[pod.gpu].util if metric == "util" else gpus[pod.gpu].fb
    return values


def cluster_average(shape: str) -> float:
    """The mean over physical GPUs; ``copies`` drops the series of GPUs without pods."""
    gpus = [gpu for gpu in GPUS if shape != "copies" or any(p.gpu == gpu.index for p in PODS)]
    return sum(gpu.util for gpu in gpus) / len(gpus)


def per_pod_checks(shape: str) -> list[dict[str, Any]]:
    checks = []
    for metric, key in (
        (monitoring.GPU_UTILIZATION_METRIC, "util"),
        ("gpu_framebuffer_used_mebibytes", "fb"),
    ):
        rule = monitoring.adapter_rule(metric)
        values = expected(shape, key)
        for namespace in sorted({pod.namespace for pod in PODS}):
            names = [pod.name for pod in PODS if pod.namespace == namespace]
            matchers = f'namespace="{namespace}",pod=~"{"|".join(names)}"'
            checks.append(
                {
                    "expr": monitoring.adapter_metrics_query(rule, matchers, "pod"),
                    "eval_time": EVAL_TIME,
                    "exp_samples": [
                        {"labels": f'{{pod="{name}"}}', "value": values[name]}
                        for name in names
                        if name in values
                    ],
                }
            )
    return checks


def scaling_checks(shape: str) -> list[dict[str, Any]]:
    (external,) = monitoring.adapter_rules()["external"]
    keda = monitoring.workload_gpu_utilization_query(LLM.namespace, "llm-.*")
    return [
        *per_pod_checks(shape),
        {
            "expr": monitoring.adapter_metrics_query(external, "", ""),
            "eval_time": EVAL_TIME,
            "exp_samples": [{"labels": "{}", "value": round(cluster_average(shape), 6)}],
        },
        {
            "expr": keda,
            "eval_time": EVAL_TIME,
            "exp_samples": [{"labels": "{}", "value": expected(shape, "util")[LLM.name]}],
        },
    ]


def unit_test_document() -> dict[str, Any]:
    return {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": f"{shape}, {node_label}",
                "interval": "1m",
                "input_series": exporter_series(shape, node_label),
                "promql_expr_test": scaling_checks(shape),
            }
            for shape in SHAPES
            for node_label in ("Hostname", "hostname")
        ],
    }


def render() -> str:
    header = (
        "# Generated by tests/infra/promtool_scaling.py; edit the cases there and regenerate:\n"
        "#   python -m tests.infra.promtool_scaling > tests/infra/promtool/gpu-scaling.test.yaml\n"
    )
    body = yaml.dump(unit_test_document(), Dumper=_IndentedDumper, sort_keys=False, width=1000)
    return header + body


if __name__ == "__main__":
    print(render(), end="")
