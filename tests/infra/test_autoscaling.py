"""WorkloadAutoscaling under Pulumi mocks: the example workload under each workloadAutoscaler.

Test double: Pulumi's mock engine instead of a Kubernetes API server and helm; the recorded inputs
are what the API server and helm would receive. The rendered objects and their schemas are checked
in test_render.py and test_render_schema.py, the ScaledObject's query on a real Prometheus in
test_promql.py.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra import monitoring
from infra.render.program import ProgramRun, run_stack
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK

SCALED_OBJECT = "kubernetes:keda.sh/v1alpha1:ScaledObject"
HPA = "kubernetes:autoscaling/v2:HorizontalPodAutoscaler"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
WORKLOAD = {"namespace": "serving", "name": "llm", "minReplicas": 1}
SERVING = {
    "servingQuery": 'sum(rate(nginx_ingress_controller_requests{service="llm"}[2m]))',
    "servingTarget": 20,
    "servingActivation": 1,
}


def example(run: ProgramRun) -> dict[str, Any]:
    inputs: dict[str, Any] = run.one(DEPLOYMENT, "example-workload").inputs
    return inputs


def test_keda_scales_the_example_on_the_adapters_gpu_metric(eks_run: ProgramRun) -> None:
    keda = eks_run.release("keda").inputs
    assert (keda["namespace"], keda["version"]) == ("keda", "2.20.2")
    scaled = eks_run.one(SCALED_OBJECT).inputs
    assert scaled["metadata"] == {"name": "llm-server", "namespace": "inference"}
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "llm-server",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert (
        metadata["serverAddress"] == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    )
    assert (metadata["threshold"], metadata["activationThreshold"]) == ("60", "10")
    # The one GPU metric: the adapter rule's metricsQuery, for the Deployment's pods.
    rule = monitoring.adapter_rule(monitoring.GPU_UTILIZATION_METRIC)
    pods = 'namespace="inference",pod=~"llm-server-[a-z0-9]+-[a-z0-9]+"'
    assert metadata["query"] == (
        f"sum({monitoring.adapter_metrics_query(rule, pods, 'namespace, pod')})"
    )
    # Every use of the series is narrowed to the Deployment's pods, but the device series the
    # fallback joins on (which has no pod label; tests/infra/promtool_scaling.py).
    assert metadata["query"].count(pods) == 3
    assert metadata["query"].count('DCGM_FI_DEV_GPU_UTIL{pod=""}') == 2
    assert eks_run.of_type(HPA) == []
    # KEDA owns the replica count: Pulumi leaves it alone.
    assert "replicas" not in example(eks_run)["spec"]
    depends = {eks_run.by_urn(u).name for u in eks_run.one(SCALED_OBJECT).dependencies}
    assert {"keda", "example-workload"} <= depends


def test_example_deployment_requests_a_gpu_on_gpu_nodes(eks_run: ProgramRun) -> None:
    pod = example(eks_run)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    # Least privilege: no API token, not root, read-only image, writes only to its volumes.
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/cache", "/tmp"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["HOME"], env["HF_HOME"]) == ("/cache", "/cache/huggingface")
    monitor = eks_run.one(
        "kubernetes:monitoring.coreos.com/v1:PodMonitor", "example-workload-pod-monitor"
    ).inputs
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics"}]


def test_the_example_starts_as_a_user_without_a_passwd_entry(eks_run: ProgramRun) -> None:
    """Uid 10001 has no passwd entry in the image; getpass.getuser() (PyTorch
    Inductor's cache) reads USER first, else raises KeyError."""
    deployment = example(eks_run)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert pod["securityContext"]["runAsUser"] == 10001
    assert env["USER"] == "vllm"
    assert env["HOME"] == "/cache"  # writable: a volume
    # A 10 GB image, then the model's download and compilation: 20 minutes to the first /health,
    # 45 for the Deployment's progress with the pull.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 20 * 60
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert deployment["spec"]["progressDeadlineSeconds"] == 45 * 60


def test_pulumi_up_does_not_wait_for_the_example(eks_run: ProgramRun) -> None:
    """A first start takes up to half an hour; it must not hold or fail
    `pulumi up`."""
    for kind, name in (
        ("kubernetes:apps/v1:Deployment", "example-workload"),
        ("kubernetes:core/v1:Service", "example-workload-service"),
    ):
        resource = eks_run.one(kind, name)
        assert resource.inputs["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    namespace = eks_run.one("kubernetes:core/v1:Namespace", "example-workload-namespace")
    assert namespace.inputs["metadata"]["name"] == "inference"


def test_a_serving_metric_is_the_trigger_and_allows_zero() -> None:
    run = run_stack(
        EKS_STACK, overrides={"exampleWorkload": {**WORKLOAD, "minReplicas": 0, **SERVING}}
    )
    spec = run.one(SCALED_OBJECT).inputs["spec"]
    assert spec["minReplicaCount"] == 0
    (trigger,) = spec["triggers"]
    assert trigger["metadata"]["query"] == SERVING["servingQuery"]
    assert (trigger["metadata"]["threshold"], trigger["metadata"]["activationThreshold"]) == (
        "20",
        "1",
    )
    # Without minReplicas it scales to zero too.
    run = run_stack(EKS_STACK, overrides={"exampleWorkload": {"name": "llm", **SERVING}})
    assert run.one(SCALED_OBJECT).inputs["spec"]["minReplicaCount"] == 0


def test_hpa_scales_on_the_same_metric_through_the_adapter() -> None:
    run = run_stack(EKS_STACK, overrides={"workloadAutoscaler": "hpa"})
    assert run.of_type(SCALED_OBJECT) == []
    assert [r.inputs["chart"] for r in run.releases() if r.inputs["chart"] == "keda"] == []
    hpa = run.one(HPA).inputs
    assert hpa["metadata"]["namespace"] == "inference"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "llm-server"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == monitoring.GPU_UTILIZATION_METRIC
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "60"}
    assert "replicas" not in example(run)["spec"]


@pytest.mark.parametrize("stack", [EKS_STACK, KUBEADM_STACK], ids=["eks", "kubeadm"])
def test_none_runs_the_example_with_fixed_replicas(stack: object) -> None:
    run = run_stack(
        stack,  # type: ignore[arg-type]
        overrides={"workloadAutoscaler": "none", "exampleWorkload": {**WORKLOAD, "minReplicas": 2}},
    )
    assert run.of_type(SCALED_OBJECT) == []
    assert run.of_type(HPA) == []
    assert [r for r in run.releases() if r.inputs["chart"] == "keda"] == []
    assert example(run)["spec"]["replicas"] == 2


def test_without_an_example_keda_alone_is_installed() -> None:
    run = run_stack(EKS_STACK, overrides={"exampleWorkload": None})
    assert run.release("keda")
    assert run.of_type(DEPLOYMENT) == []
    assert run.of_type(SCALED_OBJECT) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # The old key gave a KeyError with a traceback when malformed.
        ({"exampleHpa": {"deployment": "llm"}}, "exampleHpa is gone: set workloadAutoscaler: hpa"),
        ({"workloadAutoscaler": "karpenter"}, "workloadAutoscaler must be one of keda, hpa, none"),
        ({"exampleWorkload": "llm"}, "exampleWorkload is not valid YAML/JSON"),
        ({"exampleWorkload": ["llm"]}, "exampleWorkload must be a mapping with keys namespace"),
        ({"exampleWorkload": {"replicas": 2}}, "exampleWorkload has unknown keys replicas"),
        (
            {"exampleWorkload": {"minReplicas": "two"}},
            r"exampleWorkload\.minReplicas must be a whole number, got 'two'",
        ),
        (
            {"exampleWorkload": {"minReplicas": 5, "maxReplicas": 2}},
            r"minReplicas \(5\) must be between 0 and maxReplicas \(2\)",
        ),
        (
            {"exampleWorkload": {"targetGpuUtilization": 150}},
            "targetGpuUtilization must be a percentage",
        ),
        ({"exampleWorkload": {"createNamespace": "yes"}}, "true or false"),
        (
            {"exampleWorkload": {"activationGpuUtilization": 70}},
            r"activationGpuUtilization must be a percentage below targetGpuUtilization \(60\)",
        ),
        (
            {"exampleWorkload": {"minReplicas": 0}},
            "minReplicas 0 needs a serving metric .* could never wake it",
        ),
        (
            {"workloadAutoscaler": "hpa", "exampleWorkload": {"minReplicas": 0}},
            "minReplicas 0 needs workloadAutoscaler keda",
        ),
        (
            {"workloadAutoscaler": "hpa", "exampleWorkload": SERVING},
            "servingQuery is a KEDA trigger",
        ),
        (
            {"exampleWorkload": {"servingQuery": "up"}},
            "needs both servingQuery and servingTarget",
        ),
    ],
)
def test_malformed_autoscaling_config_is_one_clear_error(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(pulumi.RunError, match=message):
        run_stack(EKS_STACK, overrides=overrides)
