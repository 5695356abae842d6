"""What both stacks share: stack config -> GpuPlatform + GpuProfiler on a cluster's kubeconfig.

Config keys are camelCase, in the stack project's namespace; stacks/README.md lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from infra import stack_config, versions
from infra.autoscaling import (
    WORKLOAD_AUTOSCALERS,
    ExampleWorkloadArgs,
    ServingMetric,
    WorkloadAutoscaler,
    WorkloadAutoscaling,
    WorkloadAutoscalingArgs,
)
from infra.platform import (
    GRAFANA_PORT,
    GRAFANA_SERVICE,
    PROMETHEUS_PORT,
    PROMETHEUS_SERVICE,
    GpuPlatform,
    GpuPlatformArgs,
)
from infra.profiler import GpuProfiler, GpuProfilerArgs
from profiler_app.annotations import DEFAULT_DOMAIN

EXAMPLE_WORKLOAD_FIELDS = {
    "namespace": "str",
    "name": "str",
    "createNamespace": "bool",
    "image": "str",
    "model": "str",
    "targetGpuUtilization": "int",
    "activationGpuUtilization": "int",
    "minReplicas": "int",
    "maxReplicas": "int",
    "servingQuery": "str",
    "servingTarget": "int",
    "servingActivation": "int",
}


def _serving_metric(spec: dict[str, Any]) -> ServingMetric | None:
    given = {key for key in ("servingQuery", "servingTarget", "servingActivation") if key in spec}
    if not given:
        return None
    if not {"servingQuery", "servingTarget"} <= given:
        raise stack_config.ConfigError(
            "stack config exampleWorkload: a serving metric needs both servingQuery and "
            "servingTarget"
        )
    return ServingMetric(
        query=spec["servingQuery"],
        target=spec["servingTarget"],
        activation=spec.get("servingActivation", 0),
    )


def example_workload_args(value: Any, scaler: WorkloadAutoscaler) -> ExampleWorkloadArgs | None:
    """``exampleWorkload`` from stack config; ConfigError names what is wrong with it."""
    if value is None:
        return None
    spec = stack_config.fields("exampleWorkload", value, EXAMPLE_WORKLOAD_FIELDS)
    defaults = ExampleWorkloadArgs()
    try:
        example = ExampleWorkloadArgs(
            namespace=spec.get("namespace", defaults.namespace),
            name=spec.get("name", defaults.name),
            create_namespace=spec.get("createNamespace", False),
            image=spec.get("image", defaults.image),
            model=spec.get("model", defaults.model),
            target_gpu_utilization=spec.get(
                "targetGpuUtilization", defaults.target_gpu_utilization
            ),
            activation_gpu_utilization=spec.get(
                "activationGpuUtilization", defaults.activation_gpu_utilization
            ),
            min_replicas=spec.get("minReplicas"),
            max_replicas=spec.get("maxReplicas", defaults.max_replicas),
            serving_metric=_serving_metric(spec),
        )
        if example.serving_metric is not None and scaler != "keda":
            raise ValueError("servingQuery is a KEDA trigger: it needs workloadAutoscaler keda")
        example.replicas_floor(scaler)
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config exampleWorkload: {error}") from None
    return example


def workload_autoscaler(config: pulumi.Config) -> WorkloadAutoscaler:
    """``workloadAutoscaler``: keda (default), hpa or none."""
    if stack_config.read_object(config, "exampleHpa") is not None:
        raise stack_config.ConfigError(
            "stack config exampleHpa is gone: set workloadAutoscaler: hpa and exampleWorkload "
            "(namespace, name, targetGpuUtilization, minReplicas, maxReplicas) instead"
        )
    value = config.get("workloadAutoscaler") or "keda"
    if value in WORKLOAD_AUTOSCALERS:
        return cast(WorkloadAutoscaler, value)
    raise stack_config.ConfigError(
        f"stack config workloadAutoscaler must be one of {', '.join(WORKLOAD_AUTOSCALERS)}, "
        f"got {value!r}"
    )


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
            adapter_external_metrics=workload_autoscaler(config) != "keda",
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
        image_pull_secrets=image_pull_secrets(config),
        registry_credentials=config.get_secret("profilerRegistryCredentials"),
    )


def image_pull_secrets(config: pulumi.Config) -> tuple[str, ...]:
    """``profilerImagePullSecrets``: names of pull Secrets in the profiler's namespace."""
    value = stack_config.read_object(config, "profilerImagePullSecrets")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise stack_config.ConfigError(
            f"stack config profilerImagePullSecrets must be a list of Secret names, got {value!r}"
        )
    return tuple(value)


@dataclass(frozen=True)
class GpuLayer:
    """The Kubernetes provider and the components installed through it."""

    provider: k8s.Provider
    platform: GpuPlatform
    profiler: GpuProfiler
    autoscaling: WorkloadAutoscaling


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
    scaler = workload_autoscaler(config)
    example = example_workload_args(stack_config.read_object(config, "exampleWorkload"), scaler)
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
    autoscaling = WorkloadAutoscaling(
        "workload-autoscaling",
        WorkloadAutoscalingArgs(
            prometheus_url=platform.prometheus_url,
            scaler=scaler,
            example=example,
        ),
        opts=pulumi.ResourceOptions(providers=[provider], depends_on=[platform]),
    )
    return GpuLayer(
        provider=provider, platform=platform, profiler=profiler, autoscaling=autoscaling
    )


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
