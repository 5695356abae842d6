"""GpuPlatform: GPU support and GPU monitoring on any Kubernetes cluster.

Installs, from pinned official charts, the NVIDIA device plugin, kube-prometheus-stack,
dcgm-exporter and prometheus-adapter, plus the project's dashboards and alert rules. The
Kubernetes provider comes from ``opts``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra import monitoring, versions
from infra.chart_archive import release_chart
from infra.gpu import GPU_NODE_LABEL_KEY, gpu_node_selector, gpu_tolerations
from infra.gpu_sharing import GpuSharingArgs, device_plugin_config_values, with_virtual_gpus
from infra.store.endpoint import StoreEndpoint
from infra.store.grafana import grafana_store_objects, grafana_values
from infra.versions import HelmChart

# Release names are fixed so that service names (and the URLs below) are predictable.
PROMETHEUS_STACK_RELEASE = "kube-prometheus-stack"
PROMETHEUS_SERVICE = f"{PROMETHEUS_STACK_RELEASE}-prometheus"
PROMETHEUS_PORT = 9090
GRAFANA_SERVICE = f"{PROMETHEUS_STACK_RELEASE}-grafana"
GRAFANA_PORT = 80
# The labels of Grafana's pods (the grafana subchart's selector labels): what the store's pooler
# admits from the monitoring namespace.
GRAFANA_POD_LABELS = {
    "app.kubernetes.io/name": "grafana",
    "app.kubernetes.io/instance": PROMETHEUS_STACK_RELEASE,
}
DCGM_EXPORTER_RELEASE = "dcgm-exporter"  # also the `job` label of its series
DCGM_COUNTERS_PATH = "/etc/dcgm-exporter/default-counters.csv"  # where the chart mounts the CSV
GRAFANA_ADMIN_SECRET = "grafana-admin"  # noqa: S105  a Secret's name
GRAFANA_ADMIN_KEYS = ("admin-user", "admin-password")
# What Grafana's sidecars may read cluster-wide: ConfigMaps only. The chart's own ClusterRole also
# grants every Secret of the cluster, which dashboards and datasources in ConfigMaps do not need.
GRAFANA_SIDECAR_ROLE = "grafana-sidecar-configmap-reader"
DASHBOARD_LABEL = "grafana_dashboard"
# The adapter's per-pod GPU metric (the smoke suite reads it through the custom metrics API).
CUSTOM_METRIC_GPU_UTILIZATION = monitoring.GPU_UTILIZATION_METRIC
# kube-prometheus-stack's CRDs and images take longer than helm's default 5 minutes.
RELEASE_TIMEOUT_SECONDS = 900
# Prometheus' default scrape timeout; an endpoint's timeout may not exceed its interval.
SCRAPE_TIMEOUT_SECONDS = 10
# Control-plane components whose metrics Prometheus cannot reach on either platform: EKS runs them
# out of the cluster's network, and kubeadm binds them to 127.0.0.1. Scraping them would only keep
# their "down" alerts firing, so kube-prometheus-stack's scrapes and rules for them are off.
UNREACHABLE_CONTROL_PLANE = ("kubeControllerManager", "kubeScheduler", "kubeEtcd", "kubeProxy")
# Node labels kube-state-metrics exports (kube_node_labels{label_<sanitised key>=...}).
NODE_LABELS = (GPU_NODE_LABEL_KEY, "karpenter.sh/nodepool", "karpenter.sh/capacity-type")
# dcgm-exporter on nodes of up to 8 GPUs with profiling fields (docs/dcgm-exporter-sizing.md): the
# chart's 512Mi limit is below what exporters were measured to need at rest on 1 to 8 GPUs.
DCGM_EXPORTER_MEMORY_REQUEST_MIB = 512
DCGM_EXPORTER_MEMORY_LIMIT_MIB = 1024
DCGM_EXPORTER_CPU_REQUEST = "100m"
DCGM_EXPORTER_CPU_LIMIT = "1"
# Go's soft heap limit, as a share of the memory limit: the rest is for libdcgm's native memory,
# which the Go garbage collector neither sees nor frees, and for a scrape's transient peak.
GO_MEMORY_LIMIT_SHARE = 0.75


@dataclass(frozen=True)
class GpuPlatformArgs:
    """Knobs of the GPU platform; every default is safe to deploy as is."""

    monitoring_namespace: str = "monitoring"
    device_plugin_namespace: str = "nvidia-device-plugin"
    # None: a random password is generated (and exported as a secret).
    grafana_admin_password: pulumi.Input[str] | None = None
    # Set to expose Grafana through an Ingress at this host; nothing is exposed otherwise.
    grafana_ingress_host: str | None = None
    grafana_ingress_class: str = "nginx"
    prometheus_retention: str = "15d"
    # Prometheus keeps its data on a volume of this class; None: in an emptyDir, lost with the pod.
    prometheus_storage_class: str | None = None
    prometheus_storage_size: str = "50Gi"
    # dcgm-exporter samples and Prometheus scrapes at this interval; gpu-profiler's period detection
    # needs samples several times faster than the training iterations it should see.
    gpu_metrics_interval_seconds: int = 10
    # prometheus-adapter's external metrics API; off where KEDA serves external.metrics.k8s.io
    # (both would register the same APIService).
    adapter_external_metrics: bool = True
    # The profiler's PostgreSQL store, provisioned in Grafana as a data source (read-only user).
    store_datasource: StoreEndpoint | None = None
    # Device plugin configurations node pools pick by label (MIG strategy, time-slicing, MPS).
    gpu_sharing: GpuSharingArgs = field(default_factory=GpuSharingArgs)
    charts: dict[str, HelmChart] = field(
        default_factory=lambda: {
            "device-plugin": versions.NVIDIA_DEVICE_PLUGIN,
            "kube-prometheus-stack": versions.KUBE_PROMETHEUS_STACK,
            "dcgm-exporter": versions.DCGM_EXPORTER,
            "prometheus-adapter": versions.PROMETHEUS_ADAPTER,
        }
    )

    def __post_init__(self) -> None:
        if self.gpu_metrics_interval_seconds < 1:
            raise ValueError(
                f"gpuMetricsIntervalSeconds must be at least 1, got "
                f"{self.gpu_metrics_interval_seconds}"
            )


def helm_release(
    name: str,
    chart: HelmChart,
    namespace: pulumi.Input[str],
    values: pulumi.Input[Mapping[str, Any]],
    opts: pulumi.ResourceOptions,
    *,
    skip_crds: bool = False,
) -> k8s.helm.v3.Release:
    """A release of a pinned chart, rolled back if it does not become ready.

    A chart of a classic repository is installed from its archive, checked against the pin
    before the Release is declared (infra/chart_archive.py: fetched into the chart cache where
    missing); an OCI chart Helm pulls from its registry where `pulumi up` runs.
    """
    source, repository = release_chart(chart)
    return k8s.helm.v3.Release(
        name,
        k8s.helm.v3.ReleaseArgs(
            name=name,
            chart=source,
            version=chart.version,
            repository_opts=(
                k8s.helm.v3.RepositoryOptsArgs(repo=repository) if repository else None
            ),
            namespace=namespace,
            values=values,
            atomic=True,
            cleanup_on_fail=True,
            timeout=RELEASE_TIMEOUT_SECONDS,
            skip_crds=skip_crds or None,
        ),
        opts,
    )


def namespace_name(namespace: k8s.core.v1.Namespace) -> pulumi.Output[str]:
    """The name of a namespace, as an output that depends on its creation."""
    return namespace.metadata.apply(lambda meta: str(meta.name))


def device_plugin_values(sharing: GpuSharingArgs | None = None) -> dict[str, Any]:
    """Values of the NVIDIA device plugin chart: GPU nodes only; devices as volume mounts by UUID;
    the configurations of ``sharing`` (infra/gpu_sharing.py) where node pools pick them.

    GPU nodes' container toolkits ignore NVIDIA_VISIBLE_DEVICES from unprivileged containers (so a
    CUDA image cannot take every GPU without requesting one) and accept the device list as volume
    mounts, which only the device plugin hands out. UUIDs, not indexes, name the devices, so that
    dcgm-exporter and the profiler attribute each GPU to the pod that holds it.
    """
    return {
        "nodeSelector": gpu_node_selector(),
        "tolerations": [
            *gpu_tolerations(),
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
        ],
        "priorityClassName": "system-node-critical",
        "deviceListStrategy": "volume-mounts",
        "deviceIDStrategy": "uuid",
        # GPU feature discovery labels each GPU node with its product, count and memory
        # (nvidia.com/gpu.product, ...), which `gpu-profiler trial` places trials by; it runs on
        # the chart's node-feature-discovery subchart (its worker tolerates the GPU taint).
        "gfd": {"enabled": True},
        **device_plugin_config_values(sharing or GpuSharingArgs()),
    }


def prometheus_stack_values(args: GpuPlatformArgs) -> dict[str, Any]:
    """Values of kube-prometheus-stack."""
    grafana: dict[str, Any] = {
        "admin": {
            "existingSecret": GRAFANA_ADMIN_SECRET,
            "userKey": GRAFANA_ADMIN_KEYS[0],
            "passwordKey": GRAFANA_ADMIN_KEYS[1],
        },
        "service": {"type": "ClusterIP"},
        # Dashboards and data sources from the project's namespace only (the chart's default
        # for dashboards is every namespace: anyone who can write a ConfigMap could add one).
        "sidecar": {
            "dashboards": {
                "enabled": True,
                "label": DASHBOARD_LABEL,
                "labelValue": "1",
                "resource": "configmap",
                "searchNamespace": args.monitoring_namespace,
            },
            "datasources": {
                "resource": "configmap",
                "searchNamespace": args.monitoring_namespace,
            },
        },
        "rbac": {"useExistingClusterRole": GRAFANA_SIDECAR_ROLE},
        "ingress": {"enabled": False},
        **(grafana_values() if args.store_datasource is not None else {}),
    }
    if args.grafana_ingress_host:
        grafana["ingress"] = {
            "enabled": True,
            "ingressClassName": args.grafana_ingress_class,
            "hosts": [args.grafana_ingress_host],
        }
    prometheus_spec: dict[str, Any] = {
        # Pick up every ServiceMonitor, PodMonitor, Probe and PrometheusRule in the
        # cluster, not only those labelled with this release (dcgm-exporter's, ours).
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "podMonitorSelectorNilUsesHelmValues": False,
        "probeSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "scrapeConfigSelectorNilUsesHelmValues": False,
        "retention": args.prometheus_retention,
    }
    if args.prometheus_storage_class:
        prometheus_spec["storageSpec"] = {
            "volumeClaimTemplate": {
                "spec": {
                    "storageClassName": args.prometheus_storage_class,
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": args.prometheus_storage_size}},
                }
            }
        }
    return {
        "fullnameOverride": PROMETHEUS_STACK_RELEASE,
        "prometheus": {"service": {"type": "ClusterIP"}, "prometheusSpec": prometheus_spec},
        "alertmanager": {"service": {"type": "ClusterIP"}},
        "grafana": grafana,
        # kube_node_labels carries these, so that dashboards can tell GPU nodes (and Karpenter's).
        "kube-state-metrics": {"metricLabelsAllowlist": [f"nodes=[{','.join(NODE_LABELS)}]"]},
        **{component: {"enabled": False} for component in UNREACHABLE_CONTROL_PLANE},
    }


def dcgm_exporter_values(args: GpuPlatformArgs) -> dict[str, Any]:
    """Values of dcgm-exporter: our counters, fast sampling, a ServiceMonitor, GPU nodes only."""
    interval = args.gpu_metrics_interval_seconds
    counters = monitoring.dcgm_counters_csv()
    return {
        "image": {"tag": versions.DCGM_EXPORTER_IMAGE_TAG},
        # One "--flag=value" item each: the chart writes the list unquoted, so a bare number would
        # become a YAML integer, which the API server refuses in a container's args.
        "arguments": [
            f"--collectors={DCGM_COUNTERS_PATH}",
            f"--collect-interval={interval * 1000}",
        ],
        "customMetrics": counters,
        # The chart mounts the counters with subPath, which never sees ConfigMap updates: roll the
        # pods when the counters change.
        "podAnnotations": {
            "checksum/dcgm-counters": hashlib.sha256(counters.encode()).hexdigest(),
        },
        # Every GPU of the node, whatever the image sets. The exporter keeps the chart's SYS_ADMIN
        # capability (needed for profiling fields), which the NVIDIA container toolkit counts as
        # privileged, so this request is honoured where unprivileged ones are ignored.
        "extraEnv": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, *go_runtime_env()],
        "resources": {
            "requests": {
                "cpu": DCGM_EXPORTER_CPU_REQUEST,
                "memory": f"{DCGM_EXPORTER_MEMORY_REQUEST_MIB}Mi",
            },
            "limits": {
                "cpu": DCGM_EXPORTER_CPU_LIMIT,
                "memory": f"{DCGM_EXPORTER_MEMORY_LIMIT_MIB}Mi",
            },
        },
        # The chart always sets DCGM_EXPORTER_KUBERNETES=true: series of an allocated GPU carry the
        # namespace, pod and container using it. Copying every pod label too only adds cardinality.
        "kubernetes": {"enablePodLabels": False},
        "serviceMonitor": {
            "enabled": True,
            "interval": f"{interval}s",
            "scrapeTimeout": f"{min(interval, SCRAPE_TIMEOUT_SECONDS)}s",
            # Keep the exporter's namespace/pod labels (the GPU's workload), and drop the scrape
            # target's own so that unallocated GPUs do not look allocated to dcgm-exporter itself.
            "honorLabels": True,
            "relabelings": [{"action": "labeldrop", "regex": "^(namespace|pod|container)$"}],
            "metricRelabelings": node_label_relabelings(),
        },
        "nodeSelector": gpu_node_selector(),
        "tolerations": gpu_tolerations(),
    }


def go_runtime_env() -> list[dict[str, Any]]:
    """GOMAXPROCS from the container's CPU limit, GOMEMLIMIT below its memory limit.

    The pinned image's Go runtime sizes itself for every vCPU of the host (192 on a p5.48xlarge),
    not for the CPU limit, and each of those threads adds to a scrape's peak heap.
    """
    go_limit = int(DCGM_EXPORTER_MEMORY_LIMIT_MIB * GO_MEMORY_LIMIT_SHARE)
    return [
        {
            "name": "GOMAXPROCS",
            # Whole cores, rounded up: a limit of "1" gives 1.
            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}},
        },
        {"name": "GOMEMLIMIT", "value": f"{go_limit}MiB"},
    ]


def node_label_relabelings() -> list[dict[str, Any]]:
    """Series keep the node in ``versions.DCGM_NODE_LABEL`` whatever the exporter calls it.

    dcgm-exporter releases after the pinned one name the label ``hostname``; rules, dashboards,
    adapter rules and the profiler all read ``Hostname``.
    """
    label = versions.DCGM_NODE_LABEL
    return [
        {
            "sourceLabels": [label, label.lower()],
            "separator": "",
            "regex": "(.+)",
            "targetLabel": label,
            "action": "replace",
        },
        {"action": "labeldrop", "regex": f"^{label.lower()}$"},
    ]


def prometheus_adapter_values(prometheus_url: str, external: bool = True) -> dict[str, Any]:
    """Values of prometheus-adapter: only the project's GPU rules; external ones if ``external``."""
    rules = monitoring.adapter_rules()
    return {
        "prometheus": {"url": prometheus_url, "port": PROMETHEUS_PORT},
        "rules": {
            "default": False,
            "custom": rules["custom"],
            "external": rules["external"] if external else [],
        },
    }


class GpuPlatform(pulumi.ComponentResource):
    """Device plugin, Prometheus, Grafana, dcgm-exporter, prometheus-adapter, dashboards, rules."""

    monitoring_namespace: pulumi.Output[str]
    prometheus_url: pulumi.Output[str]
    grafana_admin_password: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: GpuPlatformArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:GpuPlatform", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        monitoring_ns = k8s.core.v1.Namespace(
            "monitoring-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.monitoring_namespace),
            opts=child,
        )
        device_plugin_ns = k8s.core.v1.Namespace(
            "device-plugin-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=args.device_plugin_namespace),
            opts=child,
        )
        namespace = namespace_name(monitoring_ns)
        in_monitoring = pulumi.ResourceOptions(parent=self, depends_on=[monitoring_ns])

        self.device_plugin = helm_release(
            "nvidia-device-plugin",
            args.charts["device-plugin"],
            namespace_name(device_plugin_ns),
            device_plugin_values(args.gpu_sharing),
            pulumi.ResourceOptions(parent=self, depends_on=[device_plugin_ns]),
        )

        password: pulumi.Input[str]
        if args.grafana_admin_password is None:
            generated = random.RandomPassword(
                "grafana-admin-password", length=32, special=False, opts=child
            )
            password = generated.result
        else:
            password = args.grafana_admin_password
        self.grafana_admin_password = pulumi.Output.secret(password)
        grafana_secret = k8s.core.v1.Secret(
            "grafana-admin-secret",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=GRAFANA_ADMIN_SECRET, namespace=namespace),
            type="Opaque",
            string_data={
                GRAFANA_ADMIN_KEYS[0]: "admin",
                GRAFANA_ADMIN_KEYS[1]: self.grafana_admin_password,
            },
            opts=in_monitoring,
        )

        sidecar_role = k8s.rbac.v1.ClusterRole(
            "grafana-sidecar-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=GRAFANA_SIDECAR_ROLE),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=[""], resources=["configmaps"], verbs=["get", "watch", "list"]
                )
            ],
            opts=child,
        )
        # Grafana's pod refers to the store's reader Secret and CA: they come first.
        store_objects = (
            grafana_store_objects(args.store_datasource, namespace, in_monitoring)
            if args.store_datasource is not None
            else []
        )
        self.prometheus_stack = helm_release(
            PROMETHEUS_STACK_RELEASE,
            args.charts["kube-prometheus-stack"],
            namespace,
            prometheus_stack_values(args),
            pulumi.ResourceOptions(
                parent=self,
                depends_on=[monitoring_ns, grafana_secret, sidecar_role, *store_objects],
            ),
        )
        # Everything below uses the operator's CRDs or Prometheus itself.
        after_stack = pulumi.ResourceOptions(parent=self, depends_on=[self.prometheus_stack])

        self.dcgm_exporter = helm_release(
            DCGM_EXPORTER_RELEASE,
            args.charts["dcgm-exporter"],
            namespace,
            with_virtual_gpus(dcgm_exporter_values(args), args.gpu_sharing),
            after_stack,
        )
        self.prometheus_url = pulumi.Output.concat(
            "http://", PROMETHEUS_SERVICE, ".", namespace, ".svc:", str(PROMETHEUS_PORT)
        )
        adapter_url = pulumi.Output.concat("http://", PROMETHEUS_SERVICE, ".", namespace, ".svc")
        self.prometheus_adapter = helm_release(
            "prometheus-adapter",
            args.charts["prometheus-adapter"],
            namespace,
            adapter_url.apply(
                lambda url: prometheus_adapter_values(url, args.adapter_external_metrics)
            ),
            after_stack,
        )

        self.dashboards = [
            k8s.core.v1.ConfigMap(
                f"dashboard-{file_name.removesuffix('.json')}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=f"dashboard-{file_name.removesuffix('.json')}",
                    namespace=namespace,
                    labels={DASHBOARD_LABEL: "1"},
                ),
                data={file_name: text},
                opts=in_monitoring,
            )
            for file_name, text in monitoring.dashboards().items()
        ]
        self.rules = k8s.apiextensions.CustomResource(
            "gpu-rules",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="gpu-rules", namespace=namespace),
            spec=monitoring.prometheus_rules(),
            opts=after_stack,
        )

        self.monitoring_namespace = namespace
        self.register_outputs(
            {
                "monitoring_namespace": self.monitoring_namespace,
                "prometheus_url": self.prometheus_url,
                "grafana_admin_password": self.grafana_admin_password,
            }
        )
