"""Fixtures: each stack's program run once under Pulumi mocks with its example config."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.render.program import ProgramRun, run_stack

REPO_ROOT = Path(__file__).resolve().parents[2]
EKS_STACK = REPO_ROOT / "stacks" / "eks"
KUBEADM_STACK = REPO_ROOT / "stacks" / "kubeadm"


@pytest.fixture(scope="session")
def eks_run() -> ProgramRun:
    """stacks/eks with Pulumi.dev.yaml."""
    return run_stack(EKS_STACK)


@pytest.fixture(scope="session")
def kubeadm_run() -> ProgramRun:
    """stacks/kubeadm with Pulumi.dev.yaml."""
    return run_stack(KUBEADM_STACK)
