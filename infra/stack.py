"""What both stacks share: stack config -> GpuPlatform + GpuProfiler on a cluster's kubeconfig.

Config keys are camelCase, in the stack project's namespace; stacks/README.md lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import stack_config, versions
from infra.platform import (
    GRAFANA_PORT,
    GRAFANA_SERVICE,
    PROMETHEUS_PORT,
    PROMETHEUS_SERVICE,
    ExampleHpaArgs,
    GpuPlatform,
    GpuPlatformArgs,
)
from infra.profiler import GpuProfiler, GpuProfilerArgs
from profiler_app.annotations import DEFAULT_DOMAIN

EXAMPLE_HPA_FIELDS = {
    "namespace": "str",
    "deployment": "str",
    "targetGpuUtilization": "int",
    "minReplicas": "int",
    "maxReplicas": "int",
    "createNamespace": "bool",
}


def example_hpa_args(value: Any) -> ExampleHpaArgs | None:
    """``exampleHpa`` from stack config; ConfigError names what is wrong with it."""
    if value is None:
        return None
    hpa = stack_config.fields(
        "exampleHpa", value, EXAMPLE_HPA_FIELDS, frozenset({"namespace", "deployment"})
    )
    try:
        return ExampleHpaArgs(
            namespace=hpa["namespace"],
            deployment=hpa["deployment"],
            target_gpu_utilization=hpa.get("targetGpuUtilization", 60),
            min_replicas=hpa.get("minReplicas", 1),
            max_replicas=hpa.get("maxReplicas", 4),
            create_namespace=hpa.get("createNamespace", False),
        )
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config exampleHpa: {error}") from None


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def platform_args(
    config: pulumi.Config, prometheus_storage_class: str | None = None
) -> GpuPlatformArgs:
    """GpuPlatform's arguments from stack config (``prometheusStorageClass`` over the default)."""
    try:
        return GpuPlatformArgs(
            monitoring_namespace=config.get("monitoringNamespace") or "monitoring",
            grafana_admin_password=config.get_secret("grafanaAdminPassword"),
            grafana_ingress_host=config.get("grafanaIngressHost"),
            grafana_ingress_class=config.get("grafanaIngressClass") or "nginx",
            prometheus_retention=config.get("prometheusRetention") or "15d",
            prometheus_storage_class=(
                config.get("prometheusStorageClass") or prometheus_storage_class
            ),
            prometheus_storage_size=config.get("prometheusStorageSize") or "50Gi",
            gpu_metrics_interval_seconds=_default(config.get_int("gpuMetricsIntervalSeconds"), 10),
            example_hpa=example_hpa_args(stack_config.read_object(config, "exampleHpa")),
        )
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config: {error}") from None


def profiler_args(
    config: pulumi.Config, prometheus_url: pulumi.Input[str], monitoring_namespace: str
) -> GpuProfilerArgs:
    """GpuProfiler's arguments from stack config."""
    return GpuProfilerArgs(
        prometheus_url=prometheus_url,
        image=config.get("profilerImage") or versions.PROFILER_IMAGE,
        namespace=config.get("profilerNamespace") or "gpu-profiler",
        store_url=config.get_secret("profilerStoreUrl"),
        annotation_domain=config.get("annotationDomain") or DEFAULT_DOMAIN,
        interval=config.get("profilerInterval") or "30s",
        window=config.get("profilerWindow") or "30m",
        log_level=config.get("profilerLogLevel") or "info",
        monitoring_namespace=monitoring_namespace,
    )


@dataclass(frozen=True)
class GpuLayer:
    """The Kubernetes provider and the components installed through it."""

    provider: k8s.Provider
    platform: GpuPlatform
    profiler: GpuProfiler


@dataclass(frozen=True)
class StorageClassSpec:
    """A StorageClass the stack creates for Prometheus' volume (the platform's block storage)."""

    name: str
    provisioner: str
    parameters: dict[str, str]


def deploy_gpu_layer(
    config: pulumi.Config,
    kubeconfig: pulumi.Input[str],
    depends_on: list[pulumi.Resource] | None = None,
    storage_class: StorageClassSpec | None = None,
) -> GpuLayer:
    """Monitoring and profiling on the cluster behind ``kubeconfig``.

    ``storage_class``: created first, and Prometheus' volume uses it unless the stack config names
    another class (``prometheusStorageClass``).
    """
    p_args = platform_args(config, storage_class.name if storage_class else None)
    provider = k8s.Provider(
        "cluster-provider",
        kubeconfig=kubeconfig,
        opts=pulumi.ResourceOptions(depends_on=depends_on or []),
    )
    platform_depends: list[pulumi.Resource] = []
    if storage_class is not None:
        platform_depends.append(
            k8s.storage.v1.StorageClass(
                "prometheus-storage-class",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=storage_class.name),
                provisioner=storage_class.provisioner,
                parameters=storage_class.parameters,
                volume_binding_mode="WaitForFirstConsumer",  # in the zone of the pod's node
                allow_volume_expansion=True,
                reclaim_policy="Delete",
                opts=pulumi.ResourceOptions(provider=provider),
            )
        )
    on_cluster = pulumi.ResourceOptions(providers=[provider], depends_on=platform_depends)
    platform = GpuPlatform("gpu-platform", p_args, opts=on_cluster)
    profiler = GpuProfiler(
        "gpu-profiler",
        profiler_args(config, platform.prometheus_url, p_args.monitoring_namespace),
        opts=pulumi.ResourceOptions(providers=[provider], depends_on=[platform]),
    )
    return GpuLayer(provider=provider, platform=platform, profiler=profiler)


def export_access(
    cluster_name: pulumi.Input[str], kubeconfig: pulumi.Input[str], layer: GpuLayer
) -> None:
    """Stack outputs: the kubeconfig (secret), names, and how to reach Grafana and Prometheus."""
    namespace = layer.platform.monitoring_namespace
    pulumi.export("clusterName", cluster_name)
    pulumi.export("kubeconfig", pulumi.Output.secret(kubeconfig))
    pulumi.export("grafanaAdminPassword", layer.platform.grafana_admin_password)
    pulumi.export(
        "grafanaPortForward",
        pulumi.Output.concat(
            "kubectl -n ", namespace, f" port-forward svc/{GRAFANA_SERVICE} 3000:{GRAFANA_PORT}"
        ),
    )
    pulumi.export(
        "prometheusPortForward",
        pulumi.Output.concat(
            "kubectl -n ",
            namespace,
            f" port-forward svc/{PROMETHEUS_SERVICE} {PROMETHEUS_PORT}:{PROMETHEUS_PORT}",
        ),
    )
    pulumi.export("prometheusUrlInCluster", layer.platform.prometheus_url)
    pulumi.export("profilerNamespace", layer.profiler.namespace)
