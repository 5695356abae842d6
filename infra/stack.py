"""What both stacks share: stack config -> GpuPlatform + GpuProfiler on a cluster's kubeconfig.

Config keys are camelCase, in the stack project's namespace; stacks/README.md lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import versions
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


def platform_args(config: pulumi.Config) -> GpuPlatformArgs:
    """GpuPlatform's arguments from stack config."""
    hpa: dict[str, Any] | None = config.get_object("exampleHpa")
    return GpuPlatformArgs(
        monitoring_namespace=config.get("monitoringNamespace") or "monitoring",
        grafana_admin_password=config.get_secret("grafanaAdminPassword"),
        grafana_ingress_host=config.get("grafanaIngressHost"),
        grafana_ingress_class=config.get("grafanaIngressClass") or "nginx",
        prometheus_retention=config.get("prometheusRetention") or "15d",
        gpu_metrics_interval_seconds=config.get_int("gpuMetricsIntervalSeconds") or 10,
        example_hpa=(
            ExampleHpaArgs(
                namespace=hpa["namespace"],
                deployment=hpa["deployment"],
                target_gpu_utilization=int(hpa.get("targetGpuUtilization", 60)),
                min_replicas=int(hpa.get("minReplicas", 1)),
                max_replicas=int(hpa.get("maxReplicas", 4)),
            )
            if hpa
            else None
        ),
    )


def profiler_args(
    config: pulumi.Config, prometheus_url: pulumi.Input[str], monitoring_namespace: str
) -> GpuProfilerArgs:
    """GpuProfiler's arguments from stack config."""
    return GpuProfilerArgs(
        prometheus_url=prometheus_url,
        image=config.get("profilerImage") or versions.PROFILER_IMAGE,
        namespace=config.get("profilerNamespace") or "gpu-profiler",
        store_url=config.get_secret("profilerStoreUrl"),
        annotation_domain=config.get("annotationDomain") or "ai.centaurus.io",
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


def deploy_gpu_layer(
    config: pulumi.Config,
    kubeconfig: pulumi.Input[str],
    depends_on: list[pulumi.Resource] | None = None,
) -> GpuLayer:
    """Monitoring and profiling on the cluster behind ``kubeconfig``."""
    provider = k8s.Provider(
        "cluster-provider",
        kubeconfig=kubeconfig,
        opts=pulumi.ResourceOptions(depends_on=depends_on or []),
    )
    on_cluster = pulumi.ResourceOptions(providers=[provider])
    p_args = platform_args(config)
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
