"""The smoke suite (checks/) against the stand-in GPU cluster (tests/support/gpu_cluster): every
check passes on a healthy cluster, and on a cluster broken in one way exactly the checks that
must notice fail, each naming what to fix.

Each case runs the suite as users do, ``pytest tests/smoke/checks --kubeconfig=...
--junitxml=...``, in a subprocess against a cluster of its own (a real Prometheus behind the
stand-in API server's service proxy), and reads the verdicts from the JUnit XML it wrote. Cases
run side by side: most of their time is the checks waiting out their time limit.

The opt-in scaling check is skipped in those runs, saying how to run it; the scaling cases run
it alone with ``--scaling``, on clusters scaled to zero GPU nodes with the stand-in Karpenter of
tests/support/gpu_cluster/karpenter.py (a test double: NodeClaims, nodes that join, consolidation
of empty ones) or without one.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.gpu_cluster import (
    GpuNode,
    Karpenter,
    Keda,
    Scenario,
    Storage,
    StoreDatabase,
    Taint,
    Unready,
    running_gpu_cluster,
)
from tests.support.gpu_cluster.controllers import DEVICE_PLUGIN
from tests.support.gpu_cluster.scenario import GPU_TAINT

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO_ROOT = Path(__file__).resolve().parents[2]
PARALLEL_CASES = 7
# Long enough for the stand-in to reach every healthy state (scrapes every second), short enough
# that a broken case's waits stay short.
SMOKE_TIMEOUT_SECONDS = 3
POD_TIMEOUT_SECONDS = 5
# The stand-in Karpenter launches in 0.3 s and consolidates after 0.5 s empty.
SCALE_TIMEOUT_SECONDS = 3

NODES_READY = "test_gpu_nodes::test_gpu_nodes_are_ready"
LABELLED_AND_TAINTED = "test_gpu_nodes::test_gpu_nodes_are_labelled_and_tainted"
ALLOCATABLE = "test_gpu_nodes::test_gpu_nodes_offer_every_gpu_they_have"
CUDA = "test_gpu_pods::test_a_pod_requesting_one_gpu_runs_a_cuda_kernel"
PEER_TO_PEER = "test_gpu_pods::test_gpus_of_an_nvswitch_node_copy_peer_to_peer"
KARPENTER = "test_autoscalers::test_karpenter_and_its_node_pools_are_ready"
KEDA = "test_autoscalers::test_keda_and_its_scaled_objects_are_ready"
VOLUME = "test_storage::test_a_volume_binds_and_takes_writes"
STORE = "test_storage::test_the_store_database_is_healthy_and_written_to"
NO_GPU = "test_gpu_pods::test_a_pod_requesting_no_gpu_sees_none"
DCGM_SERIES = "test_monitoring::test_prometheus_holds_dcgm_series_for_every_gpu"
ATTRIBUTION = "test_monitoring::test_dcgm_series_name_the_pod_using_the_gpu"
CUSTOM_METRICS = "test_monitoring::test_custom_metrics_api_serves_gpu_utilization"
ALERTS = "test_monitoring::test_gpu_alert_rules_are_loaded_and_none_fire"
GRAFANA = "test_monitoring::test_grafana_refuses_the_chart_default_password"
ANNOTATIONS = "test_profiler::test_every_gpu_node_has_fresh_profiler_annotations"
EXPOSURE = "test_exposure::test_no_service_is_exposed_unless_configured"
GPU_LAYER_PODS = "test_workloads::test_every_pod_of_the_gpu_layer_runs"
SCALING = "test_scaling::test_a_gpu_pod_brings_a_gpu_node_that_goes_away_when_empty"
MIG_POD = "test_gpu_sharing::test_a_pod_requesting_one_mig_device_sees_exactly_one"
SHARED_GPU = "test_gpu_sharing::test_two_pods_share_one_time_sliced_gpu"
SHARING = (MIG_POD, SHARED_GPU)
# A whole-GPU node, an A100 80GB split into 7 x 1g.10gb and 3 x 2g.20gb (migStrategy mixed), and a
# node whose 2 GPUs are time-sliced 4 ways (nvidia.com/gpu.shared).
SHARED_NODES = (
    GpuNode("gpu-node-1"),
    GpuNode("mig-node-1", model="NVIDIA A100-SXM4-80GB", mig=(("1g.10gb",) * 7, ("2g.20gb",) * 3)),
    GpuNode("shared-node-1", time_slicing_replicas=4),
)


def daemon_set(component: str) -> str:
    return f"test_workloads::test_daemon_set_is_ready_on_every_gpu_node[{component}]"


DAEMON_SETS = [
    daemon_set(component) for component in ("device-plugin", "dcgm-exporter", "profiler")
]
MAINTENANCE = Taint("example.com/maintenance", "true")
NVSWITCH = "p5.48xlarge"  # an instance type whose GPUs hang off NVSwitches
UNTOLERATED = (
    "no pod on GPU node gpu-node-2: taint example.com/maintenance=true:NoSchedule is not "
    "tolerated (remove it from the node, or add a toleration)"
)
NO_PROMETHEUS = 'no endpoints available for service "kube-prometheus-stack-prometheus"'


@dataclass(frozen=True)
class Case:
    """A scenario, and the checks that must fail on it with (fragments of) their messages.
    A scaling case runs the opt-in scaling check alone (``--scaling``), as its users do; a sharing
    case runs the MIG and time-slicing checks alone (the others do not know MIG devices and
    shared GPUs yet: allocatable and DCGM series count whole GPUs)."""

    scenario: Scenario
    failures: dict[str, tuple[str, ...]] = field(default_factory=dict)
    scaling: bool = False
    sharing: bool = False  # runs the MIG and time-slicing checks alone


CASES: dict[str, Case] = {
    "healthy": Case(Scenario()),
    # Six breakages of the cluster.
    "untolerated-taint": Case(
        Scenario(
            gpu_nodes=(
                GpuNode("gpu-node-1"),
                GpuNode("gpu-node-2", taints=(GPU_TAINT, MAINTENANCE), instance_type=NVSWITCH),
            )
        ),
        {
            **dict.fromkeys(DAEMON_SETS, (UNTOLERATED,)),
            PEER_TO_PEER: ("gpu-node-2 offers no allocatable nvidia.com/gpu",),
            ALLOCATABLE: ("gpu-node-2 has no allocatable nvidia.com/gpu", "device plugin"),
            DCGM_SERIES: ("gpu-node-2: series of DCGM_FI_DEV_GPU_UTIL for 0", "dcgm-exporter"),
            ANNOTATIONS: ("gpu-node-2 has no ai.centaurus.io/profiled-at",),
        },
    ),
    "daemon-set-short-of-ready": Case(
        Scenario(
            unready=(
                Unready(
                    "gpu-profiler",
                    "ImagePullBackOff",
                    'Back-off pulling image "ghcr.io/centaurusinfra/gpu-profiler:0.1.0"',
                    node="gpu-node-2",
                ),
            )
        ),
        {
            daemon_set("profiler"): (
                "1 of 2 pods ready",
                "on gpu-node-2 is not ready: container gpu-profiler waiting: ImagePullBackOff",
            ),
            GPU_LAYER_PODS: ("gpu-profiler/gpu-profiler-", "ImagePullBackOff"),
            ANNOTATIONS: ("gpu-node-2 has no ai.centaurus.io/profiled-at",),
        },
    ),
    "no-dcgm-series": Case(
        Scenario(dcgm_series=False),
        {
            DCGM_SERIES: (
                "gpu-node-1: series of DCGM_FI_DEV_GPU_UTIL for 0, DCGM_FI_DEV_MEM_COPY_UTIL for 0",
                "Prometheus scrapes it",
            ),
            ALLOCATABLE: ("gpu-node-1: dcgm-exporter reports no GPU there",),
            ATTRIBUTION: ("no DCGM_FI_DEV_GPU_UTIL series carries namespace=gpu-smoke-",),
            CUSTOM_METRICS: ("could not find the metric gpu_utilization", "adapter-rules.yaml"),
        },
    ),
    "stale-annotations": Case(
        Scenario(profile_age_seconds=2 * 3600),
        {
            ANNOTATIONS: (
                "gpu-node-2: ai.centaurus.io/profiled-at=",
                "min old (limit 15 min)",
                "stuck",
            )
        },
    ),
    "grafana-accepts-prom-operator": Case(
        Scenario(grafana_admin_password="prom-operator"),
        {GRAFANA: ("accepts admin/prom-operator", "existingSecret")},
    ),
    "unrequested-pod-sees-gpus": Case(
        Scenario(runtime_honours_visible_devices_env=True),
        {NO_GPU: ("2 GPU(s) visible", "accept-nvidia-visible-devices-envvar-when-unprivileged")},
    ),
    # Further breakages, one for every other check.
    "gpu-taint-on-every-node": Case(  # nothing tolerates the GPU taint
        Scenario(system_nodes=()),
        {
            GPU_LAYER_PODS: (
                "not scheduled: 0/2 nodes are available: 2 node(s) had untolerated taint "
                "{nvidia.com/gpu: present}",
            ),
            ALLOCATABLE: (NO_PROMETHEUS,),
            DCGM_SERIES: (NO_PROMETHEUS,),
            ATTRIBUTION: (NO_PROMETHEUS,),
            ALERTS: (NO_PROMETHEUS,),
            CUSTOM_METRICS: ("APIService v1beta1.custom.metrics.k8s.io is not available",),
            GRAFANA: ('no endpoints available for service "kube-prometheus-stack-grafana"',),
            KARPENTER: ("Deployment kube-system/karpenter: 0 of 1 replicas ready", "untolerated"),
            KEDA: ("Deployment keda/keda-operator: 0 of 1 replicas ready",),
            VOLUME: ("untolerated taint {nvidia.com/gpu: present}",),
            STORE: (NO_PROMETHEUS,),
        },
    ),
    "no-gpu-node": Case(
        Scenario(gpu_nodes=()),
        {
            NODES_READY: ("0 GPU node(s), expected at least 1", "desiredSize"),
            CUDA: ("not finished after 5s: not scheduled: 0/1 nodes are available",),
            NO_GPU: ("not scheduled",),
            ATTRIBUTION: ("No test pod holds a GPU",),
            CUSTOM_METRICS: ("No test pod holds a GPU",),
        },
    ),
    "gpu-node-without-taint": Case(
        Scenario(
            gpu_nodes=(
                GpuNode("gpu-node-1"),
                GpuNode("gpu-node-2", taints=(), instance_type=NVSWITCH),
            )
        ),
        {LABELLED_AND_TAINTED: ("gpu-node-2 lacks the taint nvidia.com/gpu=present:NoSchedule",)},
    ),
    "gpu-held-back-by-device-plugin": Case(
        Scenario(
            gpu_nodes=(
                GpuNode("gpu-node-1", unhealthy_gpus=1),
                GpuNode("gpu-node-2", instance_type=NVSWITCH),
            )
        ),
        {ALLOCATABLE: ("gpu-node-1: allocatable nvidia.com/gpu is 1, but the node has 2 GPU",)},
    ),
    "attribution-to-the-wrong-gpu": Case(
        Scenario(misattributed=True),
        {ATTRIBUTION: ("but the pod sees", "points at the wrong GPU")},
    ),
    "gpu-alert-firing": Case(
        Scenario(row_remap_failures=(("gpu-node-1", 1),)),
        {ALERTS: ("GpuRowRemapFailure is firing at rest", "gpu-node-1", "runbook")},
    ),
    "adapter-down": Case(
        Scenario(unready=(Unready("prometheus-adapter", "CrashLoopBackOff", "back-off 5m0s"),)),
        {
            CUSTOM_METRICS: ("APIService v1beta1.custom.metrics.k8s.io is not available",),
            GPU_LAYER_PODS: ("prometheus-adapter", "CrashLoopBackOff"),
        },
    ),
    # CUDA, the platform's other services, storage.
    "cuda-kernel-fails": Case(  # the device is visible, its kernel fails (Fabric Manager down)
        Scenario(cuda_failure=("cuLaunchKernel", 802)),
        {
            CUDA: ("cuLaunchKernel failed: CUDA_ERROR_SYSTEM_NOT_READY (802)", "Fabric Manager"),
            PEER_TO_PEER: ("gpu-node-2: cuLaunchKernel failed: CUDA_ERROR_SYSTEM_NOT_READY (802)",),
        },
    ),
    "no-gpu-pod-never-started": Case(
        Scenario(
            start_failures=(
                (
                    "gpu-smoke-no-gpu",
                    "StartError",
                    'exec: "python3": executable file not found in $PATH',
                ),
            )
        ),
        {NO_GPU: ("terminated: StartError (exit code 128)", "printed no result", "did not start")},
    ),
    "peer-to-peer-fails": Case(
        Scenario(peer_access=False),
        {PEER_TO_PEER: ("gpu-node-2: GPU 0 cannot access GPU 1 as a peer", "NVLink")},
    ),
    "karpenter-node-class-not-ready": Case(
        Scenario(
            karpenter=Karpenter(
                launches=False,
                node_class_not_ready=(
                    "SubnetsNotFound",
                    "SubnetSelector did not match any Subnets",
                ),
            )
        ),
        {
            KARPENTER: (
                "EC2NodeClass gpu is not Ready: Ready=False (SubnetsNotFound: SubnetSelector did "
                "not match any Subnets)",
                "kubectl describe nodepool,ec2nodeclass",
            )
        },
    ),
    "keda-scaled-object-not-ready": Case(
        Scenario(
            keda=Keda(
                scaled_object_not_ready=(
                    "ScaledObjectCheckFailed",
                    "ScaledObject doesn't have correct scaleTargetRef specification",
                ),
                active="Unknown",
            )
        ),
        {
            KEDA: (
                "ScaledObject inference/llm-server is not Ready: Ready=False "
                "(ScaledObjectCheckFailed",
                "cannot tell whether its trigger is active",
            )
        },
    ),
    "keda-metrics-server-down": Case(
        Scenario(
            unready=(Unready("keda-operator-metrics-apiserver", "CrashLoopBackOff", "back-off"),)
        ),
        {
            KEDA: (
                "Deployment keda/keda-operator-metrics-apiserver: 0 of 1 replicas ready",
                "APIService v1beta1.external.metrics.k8s.io is not available",
            )
        },
    ),
    "volume-never-binds": Case(
        Scenario(storage=Storage(provisions=False)),
        {
            VOLUME: (
                "provisioning failed for PVC",
                "ProvisioningFailed",
                "UnauthorizedOperation",
                "EBS CSI driver",
            )
        },
    ),
    "store-database-unhealthy": Case(
        Scenario(store=StoreDatabase(healthy=False, failing_writes=True)),
        {
            STORE: (
                "database cluster gpu-profiler-store is Waiting for the instances to become active",
                "the profiler failed",
            )
        },
    ),
    "node-port-service": Case(
        Scenario(node_port_services=("monitoring/grafana-external",)),
        {EXPOSURE: ("Service monitoring/grafana-external is NodePort", "--allow-exposed")},
    ),
    # The opt-in scaling check, on clusters scaled to zero GPU nodes.
    "scaling": Case(Scenario(gpu_nodes=(), karpenter=Karpenter()), scaling=True),
    "scaling-without-karpenter": Case(
        Scenario(gpu_nodes=(), karpenter=None),
        {SCALING: ("serves no karpenter.sh/v1 NodeClaims", "install Karpenter")},
        scaling=True,
    ),
    "scaling-launch-fails": Case(
        Scenario(
            gpu_nodes=(),
            karpenter=Karpenter(
                launch_failure=("LaunchFailed", "creating instance, no subnets found")
            ),
        ),
        {
            SCALING: (
                "A pod requesting a GPU got no GPU node",
                "has no node after 3s",
                "Launched=Unknown (LaunchFailed: creating instance, no subnets found)",
                "EC2NodeClass",
            )
        },
        scaling=True,
    ),
    "scaling-device-plugin-missing": Case(  # a known pitfall
        Scenario(
            gpu_nodes=(),
            karpenter=Karpenter(),
            unready=(Unready(DEVICE_PLUGIN, "CrashLoopBackOff", "back-off 5m0s"),),
        ),
        {
            SCALING: (
                "of NodeClaim gpu-",
                'Initialized=Unknown (ResourceNotRegistered: Resource "nvidia.com/gpu" was '
                "requested but not registered)",
                "Insufficient nvidia.com/gpu",
                "the device plugin has not registered GPUs there",
            )
        },
        scaling=True,
    ),
    "scaling-never-consolidates": Case(
        Scenario(gpu_nodes=(), karpenter=Karpenter(consolidates=False)),
        {
            SCALING: (
                "The empty GPU node did not go away",
                "node ip-10-0-7-1.ec2.internal and NodeClaim gpu-",
                "still there 3s after its GPU pod was deleted",
                "consolidateAfter",
            )
        },
        scaling=True,
    ),
    # MIG devices and time-sliced GPUs (checks/test_gpu_sharing.py), on their own.
    "sharing": Case(Scenario(gpu_nodes=SHARED_NODES), sharing=True),
    "sharing-mig-device-leak": Case(
        Scenario(gpu_nodes=SHARED_NODES, mig_devices_leak=True),
        {
            MIG_POD: (
                "nvidia-smi -L listed 7 MIG device(s)",
                "not the one 1g.10gb requested as nvidia.com/mig-1g.10gb (offered on mig-node-1)",
                "deviceListStrategy volume-mounts",
            )
        },
        sharing=True,
    ),
    "sharing-config-not-applied": Case(
        Scenario(gpu_nodes=SHARED_NODES, sharing_not_applied=True),
        {
            SHARED_GPU: (
                "shared-node-1 is labelled time-slicing with 4 replicas of its 2 GPU(s), but "
                "offers 2 nvidia.com/gpu.shared",
                "the device plugin did not apply the sharing config",
                "Insufficient nvidia.com/gpu.shared",
            )
        },
        sharing=True,
    ),
    "scaling-from-a-gpu-node": Case(
        Scenario(karpenter=Karpenter()),
        {SCALING: ("not scaled to zero GPU nodes", "GPU node gpu-node-1 is up")},
        scaling=True,
    ),
}


def has_nvswitch_node(scenario: Scenario) -> bool:
    return any(node.instance_type == NVSWITCH for node in scenario.gpu_nodes)


@dataclass(frozen=True)
class Verdict:
    outcome: str  # passed, failed, skipped, error
    message: str


def _selection(case: Case) -> list[str]:
    """What a case runs: the whole suite, the sharing checks alone, or the scaling check alone
    with ``--scaling``."""
    if case.sharing:
        return ["tests/smoke/checks/test_gpu_sharing.py"]
    if not case.scaling:
        return ["tests/smoke/checks"]
    return [
        "tests/smoke/checks/test_scaling.py",
        "--scaling",
        f"--scale-up-timeout={SCALE_TIMEOUT_SECONDS}",
        f"--scale-down-timeout={SCALE_TIMEOUT_SECONDS}",
    ]


def run_smoke_suite(
    case: Case, folder: Path, extra: tuple[str, ...] = ()
) -> tuple[dict[str, Verdict], str]:
    """The suite's verdicts against the stand-in cluster of the case's scenario (from its JUnit
    XML), and its output."""
    folder.mkdir(parents=True, exist_ok=True)
    junit = folder / "smoke.xml"
    with running_gpu_cluster(case.scenario) as cluster:
        kubeconfig = cluster.write_kubeconfig(folder / "kubeconfig")
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *_selection(case),
                f"--kubeconfig={kubeconfig}",
                f"--junitxml={junit}",
                f"--smoke-timeout={SMOKE_TIMEOUT_SECONDS}",
                f"--smoke-pod-timeout={POD_TIMEOUT_SECONDS}",
                "-p",
                "no:cacheprovider",
                "-q",
                *extra,
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    output = completed.stdout + completed.stderr
    assert junit.exists(), output[-3000:]
    return read_junit(junit), output


def read_junit(path: Path) -> dict[str, Verdict]:
    verdicts = {}
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = "failed" if kind == "failure" else kind
                message = (element.text or "") + (element.get("message") or "")
        verdicts[f"{module}::{case.get('name')}"] = Verdict(outcome, message)
    return verdicts


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Verdict], str]]:
    folder = tmp_path_factory.mktemp("smoke-cases")
    with ThreadPoolExecutor(max_workers=PARALLEL_CASES) as pool:
        futures = {
            name: pool.submit(run_smoke_suite, case, folder / name) for name, case in CASES.items()
        }
        results = {}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as error:
                raise RuntimeError(f"case {name}: {error}") from error
        return results


@pytest.mark.parametrize("name", CASES)
def test_exactly_the_checks_that_must_notice_fail_and_say_why(
    verdicts: dict[str, tuple[dict[str, Verdict], str]], name: str
) -> None:
    results, output = verdicts[name]
    case = CASES[name]
    expected = case.failures
    if case.scaling:
        ran = {SCALING}
    elif case.sharing:
        ran = set(SHARING)
    else:
        ran = set(verdicts["healthy"][0]) - {SCALING, *SHARING}
    assert set(results) - {SCALING, *SHARING} == ran - {SCALING, *SHARING}, output[-3000:]
    if not case.scaling and not case.sharing:
        # Opt-in: skipped, saying how to run it; no MIG or time-sliced node: skipped, saying so.
        assert results[SCALING].outcome == "skipped", output[-3000:]
        assert "runs only with --scaling" in results[SCALING].message
        if all(not node.mig and not node.time_slicing_replicas for node in case.scenario.gpu_nodes):
            assert results[MIG_POD].outcome == "skipped", output[-3000:]
            assert "no GPU node offers MIG devices" in results[MIG_POD].message
            assert results[SHARED_GPU].outcome == "skipped", output[-3000:]
            assert "no GPU node is time-sliced" in results[SHARED_GPU].message
        results = {check: verdict for check, verdict in results.items() if check in ran}
    failed = {check for check, verdict in results.items() if verdict.outcome == "failed"}
    assert failed == set(expected), output[-6000:]
    # Without an NVSwitch GPU node the peer-to-peer check is skipped, saying why.
    skippable = {PEER_TO_PEER} if not has_nvswitch_node(case.scenario) else set()
    for check, verdict in results.items():
        assert verdict.outcome in ("passed", "failed") or check in skippable, (check, output)
    for check, fragments in expected.items():
        for fragment in fragments:
            assert fragment in results[check].message, (check, fragment, results[check].message)


def test_every_check_can_fail(verdicts: dict[str, tuple[dict[str, Verdict], str]]) -> None:
    """No check of the suite passes whatever the cluster does: some case breaks each one."""
    checks = set(verdicts["healthy"][0])
    assert len(checks) == 24, sorted(checks)
    broken = {check for case in CASES.values() for check in case.failures}
    assert checks - broken == set()


def test_the_suites_own_time_limits_govern_its_checks(tmp_path: Path) -> None:
    """Pytest's global timeout (pyproject's 600 s, 2 s here) must not cut a
    check short of its own, longer limits (the scaling check waits --scale-down-timeout, 3 s
    here): the check's own message, saying what to fix, is what the run reports."""
    results, output = run_smoke_suite(
        CASES["scaling-never-consolidates"], tmp_path, extra=("-o", "timeout=2")
    )
    verdict = results[SCALING]
    assert verdict.outcome == "failed", output[-3000:]
    assert "Timeout" not in verdict.message
    assert "The empty GPU node did not go away" in verdict.message
