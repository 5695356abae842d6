"""Options and fixtures of the cluster smoke suite (see tests/smoke/README.md).

Nothing runs without ``--kubeconfig``: every check is skipped with the reason. With it, the
checks run against that cluster (its current context). The suite creates one namespace,
``gpu-smoke-<random>``, for its test pods and deletes it at the end.

With testinfra's ``--hosts``, the node checks of tests/nodes/checks join the same run (they are
added to the run's paths unless already among them) against those hosts; give tests/nodes/checks
on the command line as well to use its own options (``--real-gpu``, ``--node-image``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.smoke.checks.cluster import Cluster, SmokeError
from tests.smoke.checks.layout import SMOKE_LABEL, SmokeSettings
from tests.smoke.checks.pods import HOLD_SECONDS, PodRun, cuda_pod_manifest, run_pod
from tests.smoke.checks.prometheus import Prometheus

HERE = Path(__file__).resolve().parent
NODE_CHECKS = HERE.parents[1] / "nodes" / "checks"
SKIP_REASON = (
    "no --kubeconfig given: the smoke suite checks a real cluster after `pulumi up` "
    "(tests/smoke/README.md)"
)


# (option, SmokeSettings field it sets, type, help); defaults are SmokeSettings'.
SETTINGS_OPTIONS: list[tuple[str, str, type, str]] = [
    ("--monitoring-namespace", "monitoring_namespace", str, "the stack's monitoringNamespace"),
    ("--profiler-namespace", "profiler_namespace", str, "the stack's profilerNamespace"),
    ("--annotation-domain", "annotation_domain", str, "the stack's annotationDomain"),
    ("--min-gpu-nodes", "min_gpu_nodes", int, "fail with fewer GPU nodes than this"),
    ("--smoke-image", "image", str, "image of the test pods (python3; pin it by digest)"),
    ("--smoke-timeout", "timeout_seconds", float, "seconds each check waits for the cluster"),
    ("--smoke-pod-timeout", "pod_timeout_seconds", float, "seconds a test pod may take"),
    (
        "--scale-up-timeout",
        "scale_up_timeout_seconds",
        float,
        "seconds the scaling check waits for a GPU node to come and run its pod",
    ),
    (
        "--scale-down-timeout",
        "scale_down_timeout_seconds",
        float,
        "seconds the scaling check waits for an empty GPU node to go (the NodePool's "
        "consolidateAfter and the instance's termination)",
    ),
]


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cluster smoke suite")
    group.addoption(
        "--kubeconfig",
        default=None,
        help="kubeconfig of the cluster to check (its current context); the suite skips without",
    )
    defaults = SmokeSettings()
    for option, field, kind, text in SETTINGS_OPTIONS:
        default = getattr(defaults, field)
        group.addoption(option, type=kind, default=default, help=f"{text} (default: {default})")
    group.addoption(
        "--allow-exposed",
        action="append",
        default=[],
        metavar="NAMESPACE/NAME",
        help="a NodePort or LoadBalancer Service you configured on purpose; repeat for several",
    )
    group.addoption(
        "--nvswitch-node",
        action="append",
        default=[],
        metavar="NODE",
        help="a GPU node with NVSwitches (HGX) whose GPUs must copy peer to peer; EKS nodes of "
        "p4d, p5 and p6 instance types are found by themselves (repeatable)",
    )
    group.addoption(
        "--expect-active",
        action="append",
        default=[],
        metavar="NAMESPACE/NAME",
        help="a ScaledObject whose trigger is above its activation threshold now (repeatable)",
    )
    group.addoption(
        "--storage-class",
        default=None,
        help="the StorageClass a test volume is made of (default: the cluster's default class; "
        "EKS: gp3-encrypted)",
    )
    group.addoption(
        "--scaling",
        action="store_true",
        default=False,
        help="run the scaling check: on a cluster scaled to zero GPU nodes, a GPU pod brings a "
        "Karpenter node, which goes away once empty (default: skipped)",
    )


# Fixtures that run a test pod, each waiting up to --smoke-pod-timeout.
POD_FIXTURES = ("cuda_pod", "gpu_holder_pod", "no_gpu_pod")
# Beyond the suite's own time limits: requests, pod deletion, reporting.
TIMEOUT_MARGIN_SECONDS = 300.0


def own_time_limit(item: pytest.Item, settings: SmokeSettings) -> float:
    """The longest a check can take by the suite's own limits, before it reports what to fix."""
    if item.name.startswith("test_a_gpu_pod_brings_a_gpu_node"):  # the scaling check
        return settings.scale_up_timeout_seconds + 2 * settings.scale_down_timeout_seconds
    pods = sum(1 for fixture in POD_FIXTURES if fixture in getattr(item, "fixturenames", ()))
    if "nvswitch" in item.name or "volume" in item.name:
        pods += 1
    return settings.timeout_seconds + pods * settings.pod_timeout_seconds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The smoke checks' own time limits govern them: pytest-timeout's (pyproject's 600 s) only
    stops a check that has overrun its own limits by TIMEOUT_MARGIN_SECONDS, so the check's
    message saying what to fix always comes first."""
    settings = settings_from(config)
    for item in items:
        if item.get_closest_marker("smoke") and not item.get_closest_marker("timeout"):
            limit = own_time_limit(item, settings) + TIMEOUT_MARGIN_SECONDS
            item.add_marker(pytest.mark.timeout(limit))


def _covers(argument: str, root: Path, target: Path) -> bool:
    """Whether a command-line path (maybe with ::node ids) selects tests in ``target``."""
    path = (root / argument.split("::", 1)[0]).resolve()
    return path == target or target in path.parents or path in target.parents


def pytest_configure(config: pytest.Config) -> None:
    """With --hosts, the node checks run in this same pytest run, against those hosts."""
    if not config.getoption("hosts", default=None):
        return
    root = config.invocation_params.dir
    if not any(_covers(argument, root, NODE_CHECKS) for argument in config.args):
        config.args.append(str(NODE_CHECKS))


def settings_from(config: pytest.Config) -> SmokeSettings:
    option = config.getoption
    chosen = {field: option(_dest(flag)) for flag, field, _, _ in SETTINGS_OPTIONS}
    return SmokeSettings(
        **chosen,
        allowed_exposed=frozenset(option("allow_exposed")),
        scaling=option("scaling"),
        nvswitch_nodes=frozenset(option("nvswitch_node")),
        expect_active=frozenset(option("expect_active")),
        storage_class=option("storage_class"),
    )


@pytest.fixture(scope="session")
def settings(request: pytest.FixtureRequest) -> SmokeSettings:
    return settings_from(request.config)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    kubeconfig = request.config.getoption("kubeconfig")
    if not kubeconfig:
        pytest.skip(SKIP_REASON)
    try:
        connected = Cluster.from_kubeconfig(str(kubeconfig))
    except SmokeError as error:
        pytest.exit(f"smoke suite: {error}", returncode=2)
    yield connected
    connected.close()


@pytest.fixture(scope="session")
def cluster_prometheus(cluster: Cluster, settings: SmokeSettings) -> Prometheus:
    """The cluster's Prometheus, through the API server's service proxy."""
    return Prometheus(cluster, settings.monitoring_namespace)


@pytest.fixture(scope="session")
def smoke_namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the suite's own for its test pods, deleted at the end of the run."""
    namespace = f"gpu-smoke-{secrets.token_hex(3)}"
    manifest = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {**SMOKE_LABEL, "pod-security.kubernetes.io/enforce": "baseline"},
        },
    }
    cluster.create("/api/v1/namespaces", manifest)
    yield namespace
    cluster.delete(f"/api/v1/namespaces/{namespace}")


@pytest.fixture(scope="session")
def cuda_pod(cluster: Cluster, smoke_namespace: str, settings: SmokeSettings) -> PodRun:
    """A pod that requests one GPU and runs the CUDA program: one GPU visible, a kernel's sums
    right."""
    manifest = cuda_pod_manifest(
        "gpu-smoke-cuda", settings.image, ["--expect-devices", "1"], gpus=1
    )
    return run_pod(
        cluster,
        smoke_namespace,
        manifest,
        keep_running=False,
        timeout=settings.pod_timeout_seconds,
    )


@pytest.fixture(scope="session")
def gpu_holder_pod(
    cluster: Cluster, smoke_namespace: str, settings: SmokeSettings, cuda_pod: PodRun
) -> Iterator[PodRun]:
    """A pod that holds one GPU while the monitoring checks look for it, and says which GPU.

    Created after the CUDA pod has finished: a cluster with a single GPU has room for one at a
    time.
    """
    arguments = ["--expect-devices", "1", "--hold", str(HOLD_SECONDS)]
    manifest = cuda_pod_manifest("gpu-smoke-holder", settings.image, arguments, gpus=1)
    run = run_pod(
        cluster,
        smoke_namespace,
        manifest,
        keep_running=True,
        timeout=settings.pod_timeout_seconds,
    )
    yield run
    cluster.delete(f"/api/v1/namespaces/{smoke_namespace}/pods/{run.name}")


@pytest.fixture(scope="session")
def no_gpu_pod(cluster: Cluster, smoke_namespace: str, settings: SmokeSettings) -> PodRun:
    """A pod on a GPU node that requests no GPU, yet asks the runtime for all of them."""
    manifest = cuda_pod_manifest(
        "gpu-smoke-no-gpu",
        settings.image,
        ["--expect-devices", "0"],
        gpus=0,
        env={"NVIDIA_VISIBLE_DEVICES": "all"},
    )
    return run_pod(
        cluster,
        smoke_namespace,
        manifest,
        keep_running=False,
        timeout=settings.pod_timeout_seconds,
    )
