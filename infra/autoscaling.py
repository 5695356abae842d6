"""WorkloadAutoscaling: an example GPU inference Deployment and what scales it.

``workloadAutoscaler`` picks the scaler:

- ``keda``: the KEDA chart and a ``ScaledObject`` with a Prometheus trigger. The trigger is the
  workload's serving metric when one is given, the GPU utilisation of its pods otherwise; KEDA
  scales to zero below the activation threshold and back from zero above it.
- ``hpa``: a HorizontalPodAutoscaler on the pods' ``gpu_utilization`` from prometheus-adapter's
  custom metrics API (at least one replica: an HPA never scales to zero).
- ``none``: the Deployment runs ``minReplicas`` replicas.

Both scalers read the same GPU metric: the adapter rule ``gpu_utilization`` in
``monitoring/adapter-rules.yaml`` is the one definition, and the ScaledObject's query is that
rule's ``metricsQuery`` for the Deployment's pods
(:func:`infra.monitoring.workload_gpu_utilization_query`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import pulumi
import pulumi_kubernetes as k8s

from infra import monitoring, versions
from infra.gpu import GPU_RESOURCE, gpu_node_selector, gpu_tolerations
from infra.platform import helm_release, namespace_name
from infra.security import non_root_pod_security

WorkloadAutoscaler = Literal["keda", "hpa", "none"]
WORKLOAD_AUTOSCALERS: tuple[str, ...] = get_args(WorkloadAutoscaler)
KEDA_RELEASE = "keda"
KEDA_NAMESPACE = "keda"
SERVING_PORT = 8000  # vLLM's OpenAI-compatible API and its /metrics
CACHE_DIR = "/cache"
RUN_AS_USER = 10001  # not root (the image defaults to root); it writes only to its volumes
# The image has no passwd entry for that uid: getpass.getuser(), which PyTorch Inductor's cache
# calls, reads USER before the passwd database (without it: KeyError, a crash loop).
RUN_AS_USER_NAME = "vllm"
# Startup: the model download and vLLM's compilation and CUDA graph capture, up to 20 minutes.
STARTUP_PROBE_PERIOD_SECONDS = 10
STARTUP_PROBE_FAILURES = 120
# Pulling the image (about 10 GB) comes before the startup probe; the Deployment counts both.
PROGRESS_DEADLINE_SECONDS = 45 * 60
# `pulumi up` does not wait for the example to become ready (a first start can take half an hour,
# and a workload that fails must not fail the platform's deployment): the smoke suite checks it.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}
# KEDA's defaults, spelt out: how often the trigger is read, and how long the workload must stay
# below the activation threshold before it goes to zero.
POLLING_INTERVAL_SECONDS = 15
COOLDOWN_PERIOD_SECONDS = 300


@dataclass(frozen=True)
class ServingMetric:
    """A metric the workload's traffic drives (e.g. requests in flight), as one PromQL number."""

    query: str
    target: int  # per replica
    activation: int = 0  # above it, a workload at zero replicas gets one


@dataclass(frozen=True)
class ExampleWorkloadArgs:
    """The example inference Deployment and its scaling bounds."""

    namespace: str = "inference"
    name: str = "llm-server"
    # Create the namespace; False: it exists already (Pulumi would delete it on `destroy`).
    create_namespace: bool = False
    image: str = versions.EXAMPLE_INFERENCE_IMAGE
    model: str = versions.EXAMPLE_INFERENCE_MODEL
    target_gpu_utilization: int = 60  # percent, averaged over the pods
    activation_gpu_utilization: int = 10  # percent: KEDA's activation threshold
    min_replicas: int | None = None  # None: 0 where the scaler can wake from zero, else 1
    max_replicas: int = 4
    serving_metric: ServingMetric | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.target_gpu_utilization <= 100:
            raise ValueError(
                f"targetGpuUtilization must be a percentage (1-100), got "
                f"{self.target_gpu_utilization}"
            )
        if not 0 <= self.activation_gpu_utilization < self.target_gpu_utilization:
            raise ValueError(
                f"activationGpuUtilization must be a percentage below targetGpuUtilization "
                f"({self.target_gpu_utilization}), got {self.activation_gpu_utilization}"
            )
        if self.max_replicas < 1:
            raise ValueError(f"maxReplicas must be at least 1, got {self.max_replicas}")
        if self.min_replicas is not None and not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must be between 0 and maxReplicas "
                f"({self.max_replicas})"
            )

    @property
    def pod_pattern(self) -> str:
        """The names of the Deployment's pods: <name>-<ReplicaSet hash>-<suffix>."""
        return f"{self.name}-[a-z0-9]+-[a-z0-9]+"

    def replicas_floor(self, scaler: WorkloadAutoscaler) -> int:
        """minReplicas, or its default; ConfigError-worthy ValueError where it cannot work."""
        wakes_from_zero = scaler == "keda" and self.serving_metric is not None
        floor = self.min_replicas if self.min_replicas is not None else int(not wakes_from_zero)
        if floor == 0 and scaler == "hpa":
            raise ValueError("minReplicas 0 needs workloadAutoscaler keda: an HPA keeps one pod")
        if floor == 0 and scaler == "keda" and self.serving_metric is None:
            raise ValueError(
                "minReplicas 0 needs a serving metric (servingQuery): a Deployment with no pods "
                "has no GPU utilisation, so the GPU trigger could never wake it"
            )
        return floor


def keda_values() -> dict[str, Any]:
    """Values of the KEDA chart: the chart's defaults, CRDs installed with the release."""
    return {"crds": {"install": True}}


def trigger(args: ExampleWorkloadArgs, prometheus_url: str) -> dict[str, Any]:
    """The ScaledObject's Prometheus trigger: the serving metric if any, else GPU utilisation."""
    if args.serving_metric is not None:
        query = args.serving_metric.query
        threshold, activation = args.serving_metric.target, args.serving_metric.activation
    else:
        query = monitoring.workload_gpu_utilization_query(args.namespace, args.pod_pattern)
        threshold, activation = args.target_gpu_utilization, args.activation_gpu_utilization
    return {
        "type": "prometheus",
        # AverageValue: the query's value divided by the replicas, against the threshold; the
        # HPA's Pods metric with an AverageValue target does the same with per-pod values.
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": prometheus_url,
            "query": query,
            "threshold": str(threshold),
            "activationThreshold": str(activation),
            # No series (no pods, or no traffic yet) reads as 0, not as a scaler error.
            "ignoreNullValues": "true",
        },
    }


def scaled_object_spec(args: ExampleWorkloadArgs, prometheus_url: str) -> dict[str, Any]:
    return {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": args.name},
        "minReplicaCount": args.replicas_floor("keda"),
        "maxReplicaCount": args.max_replicas,
        "pollingInterval": POLLING_INTERVAL_SECONDS,
        "cooldownPeriod": COOLDOWN_PERIOD_SECONDS,
        "triggers": [trigger(args, prometheus_url)],
    }


def _labels(args: ExampleWorkloadArgs) -> dict[str, str]:
    return {"app.kubernetes.io/name": args.name, "app.kubernetes.io/component": "inference"}


def deployment_spec(
    args: ExampleWorkloadArgs, scaler: WorkloadAutoscaler
) -> k8s.apps.v1.DeploymentSpecArgs:
    """One GPU per pod, on GPU nodes only; replicas left to the scaler when there is one."""
    labels = _labels(args)
    probe = k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", port="http")
    )
    container = k8s.core.v1.ContainerArgs(
        name="server",
        image=args.image,
        args=["--model", args.model, "--port", str(SERVING_PORT)],
        ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=SERVING_PORT)],
        # Every cache (Hugging Face's model download, vLLM's and torch's compile caches) under
        # HOME, on a volume: the image's own filesystem stays read-only.
        env=[
            k8s.core.v1.EnvVarArgs(name="HOME", value=CACHE_DIR),
            k8s.core.v1.EnvVarArgs(name="USER", value=RUN_AS_USER_NAME),
            k8s.core.v1.EnvVarArgs(name="HF_HOME", value=f"{CACHE_DIR}/huggingface"),
        ],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "2", "memory": "8Gi", GPU_RESOURCE: "1"},
            limits={"memory": "16Gi", GPU_RESOURCE: "1"},
        ),
        # The model is downloaded and compiled at start: up to 20 minutes before the first /health.
        startup_probe=k8s.core.v1.ProbeArgs(
            http_get=probe.http_get,
            period_seconds=STARTUP_PROBE_PERIOD_SECONDS,
            failure_threshold=STARTUP_PROBE_FAILURES,
        ),
        readiness_probe=probe,
        liveness_probe=probe,
        volume_mounts=[
            k8s.core.v1.VolumeMountArgs(name="cache", mount_path=CACHE_DIR),
            k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),  # noqa: S108  a volume
        ],
        security_context=k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=False,
            read_only_root_filesystem=True,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        ),
    )
    return k8s.apps.v1.DeploymentSpecArgs(
        # Under a scaler, Pulumi must not reset the replica count on every `pulumi up`.
        replicas=None if scaler != "none" else args.replicas_floor(scaler),
        progress_deadline_seconds=PROGRESS_DEADLINE_SECONDS,
        selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels),
            spec=k8s.core.v1.PodSpecArgs(
                containers=[container],
                # It serves HTTP and never calls the Kubernetes API.
                automount_service_account_token=False,
                security_context=non_root_pod_security(RUN_AS_USER),
                node_selector=gpu_node_selector(),
                tolerations=[
                    k8s.core.v1.TolerationArgs(
                        key=t["key"], operator=t["operator"], effect=t["effect"]
                    )
                    for t in gpu_tolerations()
                ],
                volumes=[
                    k8s.core.v1.VolumeArgs(
                        name=volume, empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs()
                    )
                    for volume in ("cache", "tmp")
                ],
            ),
        ),
    )


@dataclass(frozen=True)
class WorkloadAutoscalingArgs:
    prometheus_url: pulumi.Input[str]
    scaler: WorkloadAutoscaler = "keda"
    example: ExampleWorkloadArgs | None = None


class WorkloadAutoscaling(pulumi.ComponentResource):
    """KEDA (with ``keda``) and the example workload with its ScaledObject or HPA."""

    def __init__(
        self,
        name: str,
        args: WorkloadAutoscalingArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:WorkloadAutoscaling", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.keda: k8s.helm.v3.Release | None = None
        if args.scaler == "keda":
            keda_ns = k8s.core.v1.Namespace(
                "keda-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=KEDA_NAMESPACE),
                opts=child,
            )
            self.keda = helm_release(
                KEDA_RELEASE,
                versions.KEDA,
                namespace_name(keda_ns),
                keda_values(),
                pulumi.ResourceOptions(parent=self, depends_on=[keda_ns]),
            )
        if args.example is not None:
            self._example(args.example, args)
        self.register_outputs({})

    def _example(self, example: ExampleWorkloadArgs, args: WorkloadAutoscalingArgs) -> None:
        namespace: pulumi.Input[str] = example.namespace
        in_namespace: list[pulumi.Resource] = []
        if example.create_namespace:
            created = k8s.core.v1.Namespace(
                "example-workload-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=example.namespace),
                opts=pulumi.ResourceOptions(parent=self),
            )
            namespace = namespace_name(created)
            in_namespace.append(created)
        opts = pulumi.ResourceOptions(parent=self, depends_on=in_namespace)
        labels = _labels(example)
        metadata = k8s.meta.v1.ObjectMetaArgs(name=example.name, namespace=namespace, labels=labels)
        unawaited = k8s.meta.v1.ObjectMetaArgs(
            name=example.name, namespace=namespace, labels=labels, annotations=SKIP_AWAIT
        )
        self.deployment = k8s.apps.v1.Deployment(
            "example-workload",
            metadata=unawaited,
            spec=deployment_spec(example, args.scaler),
            opts=opts,
        )
        # Its endpoints exist only once a pod is ready: not awaited either.
        k8s.core.v1.Service(
            "example-workload-service",
            metadata=unawaited,
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=labels,
                ports=[
                    k8s.core.v1.ServicePortArgs(name="http", port=SERVING_PORT, target_port="http")
                ],
            ),
            opts=opts,
        )
        # Its serving metrics (vllm:num_requests_running, ...) in Prometheus: what a serving
        # trigger reads. The job is "<namespace>/<name>".
        k8s.apiextensions.CustomResource(
            "example-workload-pod-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata=metadata,
            spec={
                "selector": {"matchLabels": labels},
                "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
            },
            opts=opts,
        )
        after_workload = pulumi.ResourceOptions(
            parent=self, depends_on=[self.deployment, *([self.keda] if self.keda else [])]
        )
        self.scaler: pulumi.Resource | None = None
        if args.scaler == "keda":
            self.scaler = k8s.apiextensions.CustomResource(
                "example-workload-scaled-object",
                api_version="keda.sh/v1alpha1",
                kind="ScaledObject",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=example.name, namespace=namespace),
                spec=pulumi.Output.from_input(args.prometheus_url).apply(
                    lambda url: scaled_object_spec(example, url)
                ),
                opts=after_workload,
            )
        elif args.scaler == "hpa":
            self.scaler = gpu_utilization_hpa(example, namespace, after_workload)


def gpu_utilization_hpa(
    example: ExampleWorkloadArgs, namespace: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> k8s.autoscaling.v2.HorizontalPodAutoscaler:
    """An HPA on the pods' mean GPU utilisation from prometheus-adapter's custom metrics API."""
    return k8s.autoscaling.v2.HorizontalPodAutoscaler(
        "example-workload-hpa",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=f"{example.name}-gpu-utilization", namespace=namespace
        ),
        spec=k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
            scale_target_ref=k8s.autoscaling.v2.CrossVersionObjectReferenceArgs(
                api_version="apps/v1", kind="Deployment", name=example.name
            ),
            min_replicas=example.replicas_floor("hpa"),
            max_replicas=example.max_replicas,
            metrics=[
                k8s.autoscaling.v2.MetricSpecArgs(
                    type="Pods",
                    pods=k8s.autoscaling.v2.PodsMetricSourceArgs(
                        metric=k8s.autoscaling.v2.MetricIdentifierArgs(
                            name=monitoring.GPU_UTILIZATION_METRIC
                        ),
                        target=k8s.autoscaling.v2.MetricTargetArgs(
                            type="AverageValue",
                            average_value=str(example.target_gpu_utilization),
                        ),
                    ),
                )
            ],
        ),
        opts=opts,
    )
