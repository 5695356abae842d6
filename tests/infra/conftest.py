"""Fixtures: each stack's program run once under Pulumi mocks with its example config, and the
object graph it creates, its Helm releases rendered from the chart cache.

The chart cache is ``$GPU_CLUSTER_CHART_CACHE``, else the user's (``--pull-charts`` fills it;
scripts/test runs it first). Tests marked ``charts`` render: without the archives they need they
are skipped, each with one line naming the cache and the charts it lacks. The stacks' programs
under mocks need no chart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import versions
from infra.render.charts import CHART_CACHE_ENV, chart_cache, missing_archives
from infra.render.graph import ObjectGraph, build_graph
from infra.render.program import ProgramRun, run_stack

REPO_ROOT = Path(__file__).resolve().parents[2]
EKS_STACK = REPO_ROOT / "stacks" / "eks"
KUBEADM_STACK = REPO_ROOT / "stacks" / "kubeadm"

# H100 capacity for multi-node training: a p5.48xlarge Capacity Block with EFA and
# RAID0 on a node group, and a Karpenter pool of p5/p5e from a reservation, with EFA.
CAPACITY_BLOCK_GROUP = {
    "name": "h100",
    "instanceTypes": ["p5.48xlarge"],
    "capacityType": "CAPACITY_BLOCK",
    "capacityReservationId": "cr-0a1b2c3d4e5f60718",
    "availabilityZone": "us-west-2b",
    "efa": True,
    "instanceStoreRaid0": True,
    "minSize": 0,
    "maxSize": 2,
    "desiredSize": 2,
}
H100_POOL = {
    "instanceFamilies": ["p5", "p5e"],
    "capacityTypes": ["reserved", "on-demand"],
    "capacityReservationIds": ["cr-0123456789abcdef0"],
    "gpuLimit": 32,
    "efa": True,
    "availabilityZone": "us-west-2b",
    "instanceStoreRaid0": True,
}
# What the stacks install with their example config (EFA's device plugin only where EFA is on).
STACK_CHARTS = tuple(c for c in versions.PINNED_CHARTS if c is not versions.EFA_DEVICE_PLUGIN)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes an object graph (a fixture named ``*_graph``) renders charts: it carries
    the ``charts`` marker whether or not it says so."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(name.endswith("_graph") for name in names) and not item.get_closest_marker("charts"):
            item.add_marker(pytest.mark.charts)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.charts``: skip, naming the cache, unless it holds the stacks' charts (and
    the marker's extra charts)."""
    for marker in item.iter_markers("charts"):
        missing = missing_archives((*STACK_CHARTS, *marker.args))
        if missing:
            pytest.skip(
                f"chart cache {chart_cache()} lacks {', '.join(missing)}: run "
                f"`python -m infra.render --pull-charts`, or set {CHART_CACHE_ENV}"
            )


@pytest.fixture(scope="session")
def eks_run() -> ProgramRun:
    """stacks/eks with Pulumi.example.yaml."""
    return run_stack(EKS_STACK)


@pytest.fixture(scope="session")
def kubeadm_run() -> ProgramRun:
    """stacks/kubeadm with Pulumi.example.yaml."""
    return run_stack(KUBEADM_STACK)


@pytest.fixture(scope="session")
def eks_graph(eks_run: ProgramRun) -> ObjectGraph:
    """Everything stacks/eks creates in its cluster (do not modify: copy it first)."""
    return build_graph(eks_run)


@pytest.fixture(scope="session")
def kubeadm_graph(kubeadm_run: ProgramRun) -> ObjectGraph:
    """Everything stacks/kubeadm creates in its cluster (do not modify: copy it first)."""
    return build_graph(kubeadm_run)
