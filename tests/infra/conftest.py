"""Fixtures: each stack's program run once under Pulumi mocks with its example config, and the
object graph it creates, its Helm releases rendered from the chart cache.

The chart cache is ``$GPU_CLUSTER_CHART_CACHE`` (scripts/test points it at ../shared/charts, the
charts at the pinned versions); a checkout beside ../shared finds it without the variable too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.render.charts import CHART_CACHE_ENV
from infra.render.graph import ObjectGraph, build_graph
from infra.render.program import ProgramRun, run_stack

REPO_ROOT = Path(__file__).resolve().parents[2]
EKS_STACK = REPO_ROOT / "stacks" / "eks"
KUBEADM_STACK = REPO_ROOT / "stacks" / "kubeadm"
SHARED_CHARTS = REPO_ROOT.parent / "shared" / "charts"

if not os.environ.get(CHART_CACHE_ENV) and SHARED_CHARTS.is_dir():
    os.environ[CHART_CACHE_ENV] = str(SHARED_CHARTS)


@pytest.fixture(scope="session")
def eks_run() -> ProgramRun:
    """stacks/eks with Pulumi.dev.yaml."""
    return run_stack(EKS_STACK)


@pytest.fixture(scope="session")
def kubeadm_run() -> ProgramRun:
    """stacks/kubeadm with Pulumi.dev.yaml."""
    return run_stack(KUBEADM_STACK)


@pytest.fixture(scope="session")
def eks_graph(eks_run: ProgramRun) -> ObjectGraph:
    """Everything stacks/eks creates in its cluster (do not modify: copy it first)."""
    return build_graph(eks_run)


@pytest.fixture(scope="session")
def kubeadm_graph(kubeadm_run: ProgramRun) -> ObjectGraph:
    """Everything stacks/kubeadm creates in its cluster (do not modify: copy it first)."""
    return build_graph(kubeadm_run)
