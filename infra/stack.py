"""What both stacks share: stack config -> GpuPlatform + GpuProfiler on a cluster's kubeconfig.

Config keys are camelCase, in the stack project's namespace; stacks/README.md lists them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
from infra.gpu_sharing import DEFAULT_CONFIG, DevicePluginConfig, GpuSharingArgs
from infra.platform import (
    GRAFANA_PORT,
    GRAFANA_SERVICE,
    PROMETHEUS_PORT,
    PROMETHEUS_SERVICE,
    GpuPlatform,
    GpuPlatformArgs,
)
from infra.profiler import GpuProfiler, GpuProfilerArgs
from infra.storage import StorageClassSpec
from infra.store.cloudnative_pg import POOLER_NAME, CloudNativePgArgs
from infra.store.deploy import StorePlan, deploy_store, plan_store
from infra.store.endpoint import POSTGRESQL_PORT, ProfilerStore
from infra.store.options import store_options
from infra.store.rds import RdsNetwork
from infra.trials import GpuTrialRunner, GpuTrialRunnerArgs
from profiler_app.core.annotations import DEFAULT_DOMAIN

REPORT_LOCAL_PORT = 15432  # `report` from a laptop, through a port-forward to the pooler

# Settings that existed once, and what replaces them (a stack that still sets one is told).
REMOVED_SETTINGS = {
    "exampleHpa": "set workloadAutoscaler: hpa and exampleWorkload (namespace, name, "
    "targetGpuUtilization, minReplicas, maxReplicas) instead",
}
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
    """``exampleWorkload`` from stack config (None or false: none); ConfigError names what is
    wrong with it."""
    if value is None or value is False:
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


def check_settings(stack_dir: Path) -> None:
    """Refuses, in one line, a stack config key the stack's Pulumi.yaml does not declare."""
    stack_config.refuse_undeclared_keys(stack_dir / "Pulumi.yaml", REMOVED_SETTINGS)


def workload_autoscaler(config: pulumi.Config) -> WorkloadAutoscaler:
    """``workloadAutoscaler``: keda (default), hpa or none."""
    value = config.get("workloadAutoscaler") or "keda"
    if value in WORKLOAD_AUTOSCALERS:
        return cast(WorkloadAutoscaler, value)
    raise stack_config.ConfigError(
        f"stack config workloadAutoscaler must be one of {', '.join(WORKLOAD_AUTOSCALERS)}, "
        f"got {value!r}"
    )


DEVICE_PLUGIN_CONFIG_FIELDS = {
    "migStrategy": "str",
    "sharing": "str",
    "replicas": "int",
    "renameByDefault": "bool",
    "failRequestsGreaterThanOne": "bool",
}


def gpu_sharing_args(config: pulumi.Config) -> GpuSharingArgs:
    """``gpuSharing`` from stack config: named device plugin configurations that GPU node pools
    pick (``devicePluginConfig``), and the default of unlabelled nodes; ConfigError says what is
    wrong with it."""
    value = stack_config.read_object(config, "gpuSharing")
    if value is None:
        return GpuSharingArgs()
    if not isinstance(value, dict) or set(value) - {"configs", "default"}:
        raise stack_config.ConfigError(
            f"stack config gpuSharing must be a mapping with keys configs, default, got {value!r}"
        )
    configs = value.get("configs") or {}
    if not isinstance(configs, dict):
        raise stack_config.ConfigError(
            "stack config gpuSharing.configs must map config names to their settings "
            f"({', '.join(DEVICE_PLUGIN_CONFIG_FIELDS)})"
        )
    names = {
        "migStrategy": "mig_strategy",
        "sharing": "sharing",
        "replicas": "replicas",
        "renameByDefault": "rename_by_default",
        "failRequestsGreaterThanOne": "fail_requests_greater_than_one",
    }
    try:
        parsed = tuple(
            DevicePluginConfig(
                name=str(name),
                **{
                    names[key]: item
                    for key, item in stack_config.fields(
                        f"gpuSharing.configs.{name}", spec or {}, DEVICE_PLUGIN_CONFIG_FIELDS
                    ).items()
                },
            )
            for name, spec in configs.items()
        )
        sharing = GpuSharingArgs(configs=parsed, default=str(value.get("default", DEFAULT_CONFIG)))
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config gpuSharing: {error}") from None
    for item in sharing.configs:
        if item.experimental:
            pulumi.log.warn(
                f"gpuSharing config {item.name}: sharing {item.sharing} is experimental (the "
                f"device plugin's MPS support; dcgm-exporter cannot name the pods of an "
                f"MPS-shared GPU), see docs/sharing.md"
            )
    return sharing


def _default(value: int | None, default: int) -> int:
    return default if value is None else value


def platform_args(
    config: pulumi.Config,
    prometheus_storage_class: str | None = None,
    gpu_sharing: GpuSharingArgs | None = None,
) -> GpuPlatformArgs:
    """GpuPlatform's arguments from stack config (``prometheusStorageClass`` over the default)."""
    try:
        return GpuPlatformArgs(
            monitoring_namespace=config.get("monitoringNamespace") or "monitoring",
            grafana_admin_password=stack_config.optional_secret(config, "grafanaAdminPassword"),
            grafana_ingress_host=stack_config.optional_text(config, "grafanaIngressHost"),
            grafana_ingress_class=config.get("grafanaIngressClass") or "nginx",
            prometheus_retention=config.get("prometheusRetention") or "15d",
            prometheus_storage_class=(
                config.get("prometheusStorageClass") or prometheus_storage_class
            ),
            prometheus_storage_size=config.get("prometheusStorageSize") or "50Gi",
            gpu_metrics_interval_seconds=_default(config.get_int("gpuMetricsIntervalSeconds"), 10),
            adapter_external_metrics=workload_autoscaler(config) != "keda",
            gpu_sharing=gpu_sharing if gpu_sharing is not None else gpu_sharing_args(config),
        )
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config: {error}") from None


def trial_runner_args(config: pulumi.Config) -> GpuTrialRunnerArgs | None:
    """The optional trial runner's arguments from stack config ``trialRunner`` (None or false:
    off)."""
    value = stack_config.read_object(config, "trialRunner")
    if value is None or value is False:
        return None
    given = stack_config.fields(
        "trialRunner",
        value,
        {"enabled": "bool", "namespace": "str", "maxGpus": "int", "maxTrials": "int"},
    )
    if not given.pop("enabled", True):
        return None
    names = {"namespace": "namespace", "maxGpus": "max_gpus", "maxTrials": "max_trials"}
    try:
        return GpuTrialRunnerArgs(**{names[key]: item for key, item in given.items()})
    except ValueError as error:
        raise stack_config.ConfigError(f"stack config {error}") from None


def profiler_args(
    config: pulumi.Config,
    prometheus_url: pulumi.Input[str],
    monitoring_namespace: str,
    store: ProfilerStore,
    kubeconfig: pulumi.Input[str] | None = None,
) -> GpuProfilerArgs:
    """GpuProfiler's arguments from stack config."""
    protect = config.get_bool("profilerProtectTraining")
    return GpuProfilerArgs(
        prometheus_url=prometheus_url,
        image=profiler_image(config),
        namespace=profiler_namespace(config),
        store=store,
        annotation_domain=config.get("annotationDomain") or DEFAULT_DOMAIN,
        interval=config.get("profilerInterval") or "30s",
        window=config.get("profilerWindow") or "30m",
        log_level=config.get("profilerLogLevel") or "info",
        protect_training=True if protect is None else protect,
        kubeconfig=kubeconfig,
        monitoring_namespace=monitoring_namespace,
        image_pull_secrets=image_pull_secrets(config),
        registry_credentials=stack_config.optional_secret(config, "profilerRegistryCredentials"),
    )


def profiler_image(config: pulumi.Config) -> str:
    return config.get("profilerImage") or versions.PROFILER_IMAGE


def profiler_namespace(config: pulumi.Config) -> str:
    return config.get("profilerNamespace") or "gpu-profiler"


def store_plan(
    config: pulumi.Config,
    platform: str,
    monitoring_namespace: str,
    storage_class: StorageClassSpec | None,
    rds_network: Callable[[], RdsNetwork] | None,
) -> StorePlan:
    """The profiler's store from stack config (step 1: nothing in the cluster yet)."""
    options = store_options(config, platform)
    try:
        return plan_store(
            options,
            default_storage_class=storage_class.name if storage_class else None,
            rds_network=rds_network() if options.kind == "rds" and rds_network else None,
            monitoring_namespace=monitoring_namespace,
            profiler_namespace=profiler_namespace(config),
            profiler_image=profiler_image(config),
        )
    except ValueError as error:
        key = "profilerRds" if options.kind == "rds" else "profilerDatabase"
        raise stack_config.ConfigError(f"stack config {key}: {error}") from None


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
    store: StorePlan
    trial_runner: GpuTrialRunner | None = None


def deploy_gpu_layer(
    config: pulumi.Config,
    kubeconfig: pulumi.Input[str],
    depends_on: list[pulumi.Resource] | None = None,
    *,
    storage_class: StorageClassSpec | None = None,
    platform_name: str = "kubeadm",
    rds_network: Callable[[], RdsNetwork] | None = None,
    gpu_sharing: GpuSharingArgs | None = None,
) -> GpuLayer:
    """Monitoring, profiling and the profiler's store on the cluster behind ``kubeconfig``.

    ``storage_class``: created first; Prometheus' volume and the database's use it unless the stack
    config names another class (``prometheusStorageClass``, ``profilerDatabase.storageClass``).
    Without one, the database's volumes come from local-path-provisioner. ``rds_network``: where
    ``profilerStore: rds`` puts the database (EKS), called only for that store. ``gpu_sharing``:
    the device plugin configurations (default: read from ``gpuSharing``), which the stack's node
    pools refer to.
    """
    p_args = platform_args(config, storage_class.name if storage_class else None, gpu_sharing)
    store = store_plan(
        config, platform_name, p_args.monitoring_namespace, storage_class, rds_network
    )
    p_args = dataclasses.replace(p_args, store_datasource=store.endpoint)
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
                # Prometheus' and the database's volumes (the resource keeps its first name).
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
    store_ready = deploy_store(
        store,
        pulumi.ResourceOptions(providers=[provider], depends_on=[platform, *platform_depends]),
    )
    profiler = GpuProfiler(
        "gpu-profiler",
        profiler_args(
            config,
            platform.prometheus_url,
            p_args.monitoring_namespace,
            store.profiler_store,
            kubeconfig,
        ),
        opts=pulumi.ResourceOptions(providers=[provider], depends_on=[platform, *store_ready]),
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
    trial_args = trial_runner_args(config)
    trial_runner = None
    if trial_args is not None:
        trial_runner = GpuTrialRunner(
            "gpu-trial-runner", trial_args, opts=pulumi.ResourceOptions(providers=[provider])
        )
    return GpuLayer(
        provider=provider,
        platform=platform,
        profiler=profiler,
        autoscaling=autoscaling,
        trial_runner=trial_runner,
        store=store,
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
    if layer.trial_runner is not None:
        pulumi.export("trialNamespace", layer.trial_runner.namespace)
    export_store(layer.store)


def export_store(store: StorePlan) -> None:
    """Which store holds the history, and for a database, how to query it from a laptop."""
    pulumi.export("profilerStore", store.options.kind)
    if store.endpoint is None:
        return
    pulumi.export("profilerStoreHost", store.endpoint.host)
    if store.database is not None:
        pulumi.export("profilerStorePortForward", report_port_forward(store.database))


def report_port_forward(database: CloudNativePgArgs) -> str:
    """The command that makes the pooler reachable on localhost:15432 (docs/store.md)."""
    return (
        f"kubectl -n {database.namespace} port-forward svc/{POOLER_NAME} "
        f"{REPORT_LOCAL_PORT}:{POSTGRESQL_PORT}"
    )
