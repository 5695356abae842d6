"""The kubernetes_node role's guard: on a host that has joined a cluster, it stops before moving
kubelet, kubeadm and kubectl to another version, since site.yml would do that on every node at
once, undrained and maybe ahead of the control plane; playbooks/upgrade_kubernetes.yml does it
safely (its kubeadm_upgrade role installs through the role's packages.yml, past the guard).

No node is booted (no root needed): real Ansible evaluates the role's own variables for made-up
hosts, from what its tasks would have registered there (kubelet.conf, dpkg's version). The
booted test nodes run the guard through kubeadm_cluster.yml on a cluster one minor behind
(tests/nodes/test_upgrade.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.nodes.harness.ansible_run import role_decisions

WANTED = "1.35.9"


def host(joined: bool, installed: str | None, **variables: Any) -> dict[str, Any]:
    """``installed``: dpkg's kubelet version, None when it is not installed."""
    read = {"stdout": installed or "", "rc": 0 if installed else 1}
    return {
        "kubernetes_node_version": WANTED,
        "_kubernetes_node_kubelet_conf": {"stat": {"exists": joined}},
        # The read is skipped (no stdout) where the host has not joined.
        "_kubernetes_node_installed_kubelet": read if joined else {"skipped": True},
        **variables,
    }


HOSTS = {
    "fresh": host(False, None),
    "built-not-joined": host(False, "1.34.3-1.1"),  # packages from an earlier run, never joined
    "joined-same": host(True, f"{WANTED}-1.1"),
    "joined-without-kubelet": host(True, None),
    "joined-behind": host(True, "1.34.3-1.1"),
    "joined-ahead": host(True, "1.36.0-1.1"),
    "joined-patch-behind": host(True, "1.35.8-1.1"),
    "joined-allowed": host(True, "1.34.3-1.1", kubernetes_node_allow_unmanaged_upgrade=True),
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    decided = role_decisions(
        tmp_path_factory.mktemp("version-guard"),
        ("kubernetes_node",),
        HOSTS,
        {"refusal": "_kubernetes_node_version_refusal"},
    )
    return {name: decision["refusal"] for name, decision in decided.items()}


def test_a_host_that_has_not_joined_takes_any_version(refusals: dict[str, str]) -> None:
    assert refusals["fresh"] == ""
    assert refusals["built-not-joined"] == ""


def test_a_joined_host_at_the_wanted_version_or_without_kubelet_goes_on(
    refusals: dict[str, str],
) -> None:
    assert refusals["joined-same"] == ""
    assert refusals["joined-without-kubelet"] == ""


@pytest.mark.parametrize(
    ("name", "installed"),
    [("joined-behind", "1.34.3"), ("joined-ahead", "1.36.0"), ("joined-patch-behind", "1.35.8")],
)
def test_a_joined_host_at_another_version_stops_with_the_way_to_upgrade(
    refusals: dict[str, str], name: str, installed: str
) -> None:
    assert refusals[name] == (
        f"{name} has joined a cluster with kubelet {installed} and kubernetes_node_version asks for"
        f" {WANTED}: applied here, that would restart the kubelet of every node at once, undrained"
        " and maybe ahead of the control plane. Run playbooks/upgrade_kubernetes.yml"
        " (docs/operations.md), which drains each node and upgrades the control plane first, or"
        " set kubernetes_node_allow_unmanaged_upgrade=true."
    )


def test_the_override_lets_the_role_change_a_joined_host(refusals: dict[str, str]) -> None:
    assert refusals["joined-allowed"] == ""
