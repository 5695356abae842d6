"""What the stacks deploy, by name: every namespace, Service, DaemonSet and label the smoke checks
look for comes from the components in infra/ (or the profiler), so a rename there is a rename here.

``SmokeSettings`` holds what a run may override on the command line (conftest.py's options):
namespaces that stack config can change, the test pod image, time limits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from infra import monitoring, versions
from infra.autoscaling import KEDA_NAMESPACE
from infra.gpu import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_RESOURCE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
)
from infra.platform import (
    CUSTOM_METRIC_GPU_UTILIZATION,
    DCGM_EXPORTER_RELEASE,
    GRAFANA_PORT,
    GRAFANA_SERVICE,
    PROMETHEUS_PORT,
    PROMETHEUS_SERVICE,
    GpuPlatformArgs,
)
from infra.profiler import PROFILER_NAME, GpuProfilerArgs
from profiler_app.commands.options import DEFAULT_FIELDS, MIG_FIELDS
from profiler_app.sinks.kubernetes import DEFAULT_DOMAIN, DEFAULT_HEARTBEAT_SECONDS, PROFILED_AT

__all__ = [
    "CUSTOM_METRIC_GPU_UTILIZATION",
    "DCGM_FIELDS",
    "DEFAULT_DOMAIN",
    "GPU_NODE_LABEL_KEY",
    "GPU_NODE_LABEL_VALUE",
    "GPU_RESOURCE",
    "GPU_TAINT_EFFECT",
    "GPU_TAINT_KEY",
    "GPU_TAINT_VALUE",
    "GRAFANA_PORT",
    "GRAFANA_SERVICE",
    "KEDA_NAMESPACE",
    "NODE_CLAIMS_PATH",
    "NODE_POOL_LABEL",
    "PROFILED_AT",
    "PROMETHEUS_PORT",
    "PROMETHEUS_SERVICE",
    "DaemonSetRef",
    "SmokeSettings",
    "gpu_alert_names",
]


def _default(cls: type, name: str) -> str:
    """A dataclass field's default: the namespace a stack uses unless its config says otherwise."""
    value = {field.name: field.default for field in dataclasses.fields(cls)}[name]
    assert isinstance(value, str)
    return value


MONITORING_NAMESPACE = _default(GpuPlatformArgs, "monitoring_namespace")
DEVICE_PLUGIN_NAMESPACE = _default(GpuPlatformArgs, "device_plugin_namespace")
PROFILER_NAMESPACE = _default(GpuProfilerArgs, "namespace")

# The fields gpu-profiler reads by default: every GPU must have a series of each (the MIG
# instances' fields only where MIG is on).
DCGM_FIELDS: tuple[str, ...] = tuple(f for f in DEFAULT_FIELDS if f not in MIG_FIELDS)
# The profiler rewrites profiled-at at least every heartbeat; allow one more cycle and slack.
ANNOTATION_MAX_AGE_SECONDS = DEFAULT_HEARTBEAT_SECONDS + 300.0

# kube-prometheus-stack's grafana.adminPassword default, which a deployment must never accept.
GRAFANA_CHART_DEFAULT_USER = "admin"
GRAFANA_CHART_DEFAULT_PASSWORD = "prom-operator"

CUSTOM_METRICS_API = "custom.metrics.k8s.io/v1beta1"
CUSTOM_METRICS_API_SERVICE = "v1beta1.custom.metrics.k8s.io"

# The test pods' image, pinned by digest (a multi-architecture index: amd64 and arm64 nodes). The
# CUDA program (cuda_check.py) needs only Python: the NVIDIA container toolkit mounts the driver's
# libcuda into a container it hands GPUs to, and the driver compiles the program's PTX kernel.
TEST_IMAGE = (
    "docker.io/library/python:3.12-slim-bookworm"
    "@sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254"
)
# Karpenter's API and the label it puts on the nodes of a NodePool (https://karpenter.sh/docs/).
NODE_CLAIMS_PATH = "/apis/karpenter.sh/v1/nodeclaims"
NODE_POOL_LABEL = "karpenter.sh/nodepool"
# EC2 instance types whose GPUs are connected by NVSwitches (HGX boards).
NVSWITCH_INSTANCE_TYPES = frozenset(
    {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
        "p6-b300.48xlarge",
    }
)
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Labels every object the smoke suite creates, so a leftover can be found and deleted.
SMOKE_LABEL = {"app.kubernetes.io/part-of": "gpu-cluster-smoke"}


def gpu_alert_names() -> list[str]:
    """The alerting rules the GpuPlatform ships (infra/monitoring/rules.yaml)."""
    return [
        rule["alert"]
        for group in monitoring.prometheus_rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


@dataclass(frozen=True)
class DaemonSetRef:
    """A DaemonSet that must run, ready, on every GPU node."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class SmokeSettings:
    """One smoke run's knobs: conftest.py fills them from the command line."""

    monitoring_namespace: str = MONITORING_NAMESPACE
    profiler_namespace: str = PROFILER_NAMESPACE
    device_plugin_namespace: str = DEVICE_PLUGIN_NAMESPACE
    min_gpu_nodes: int = 1
    image: str = TEST_IMAGE
    timeout_seconds: float = 300.0  # for the cluster to reach a checked state
    pod_timeout_seconds: float = 600.0  # for a test pod to finish, image pull included
    allowed_exposed: frozenset[str] = frozenset()  # "namespace/name" of Services meant to be
    annotation_domain: str = DEFAULT_DOMAIN
    annotation_max_age_seconds: float = ANNOTATION_MAX_AGE_SECONDS
    scaling: bool = False  # run the opt-in scaling check (test_scaling.py)
    nvswitch_nodes: frozenset[str] = frozenset()  # besides nodes of NVSWITCH_INSTANCE_TYPES
    # "namespace/name" of ScaledObjects whose trigger is above its activation threshold now.
    expect_active: frozenset[str] = frozenset()
    storage_class: str | None = None  # None: the cluster's default StorageClass
    # A GPU instance's launch, boot and device plugin registration, image pull included.
    scale_up_timeout_seconds: float = 900.0
    # The GPU NodePool's consolidateAfter, plus draining and terminating the instance.
    scale_down_timeout_seconds: float = 900.0

    def daemon_sets(self) -> dict[str, DaemonSetRef]:
        """The GPU DaemonSets by what they are. Helm names each after its release, and the
        releases are named after their charts (infra/platform.py)."""
        return {
            "device-plugin": DaemonSetRef(
                self.device_plugin_namespace, versions.NVIDIA_DEVICE_PLUGIN.name
            ),
            "dcgm-exporter": DaemonSetRef(self.monitoring_namespace, DCGM_EXPORTER_RELEASE),
            "profiler": DaemonSetRef(self.profiler_namespace, PROFILER_NAME),
        }

    def gpu_layer_namespaces(self) -> list[str]:
        return [self.device_plugin_namespace, self.monitoring_namespace, self.profiler_namespace]

    def annotation(self, name: str) -> str:
        return f"{self.annotation_domain}/{name}"
