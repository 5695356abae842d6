"""What the kubeadm_upgrade role decides before it changes anything: whether the cluster may go to
the wanted version in one step (a patch, or the next minor; never a skipped minor or a downgrade)
and whether a node is due.

No node is booted (no root needed): real Ansible evaluates the role's own variables on localhost
for made-up hosts, from what its tasks would have registered there (the API server's /version,
the installed packages, the marker an interrupted run leaves). The booted test nodes run the whole
upgrade (tests/nodes/test_upgrade.py).
"""

from __future__ import annotations

import json
import platform
from typing import Any

import pytest

from tests.nodes.harness.ansible_run import role_decisions


def packages(version: str) -> dict[str, list[dict[str, str]]]:
    return {name: [{"version": f"{version}-1.1"}] for name in ("kubeadm", "kubelet", "kubectl")}


def host(cluster: str, wanted: str, installed: str = "", drained: bool = False) -> dict[str, Any]:
    return {
        "_kubeadm_upgrade_server": {"stdout": json.dumps({"gitVersion": f"v{cluster}"})},
        "kubeadm_upgrade_version": wanted,
        "_kubeadm_upgrade_target": wanted,
        "_kubeadm_upgrade_package_facts": {
            "ansible_facts": {"packages": packages(installed or cluster)}
        },
        "_kubeadm_upgrade_marker": {"stat": {"exists": drained}},
    }


HOSTS: dict[str, dict[str, Any]] = {
    "patch": host("1.35.8", "1.35.9"),
    "next-minor": host("1.34.3", "1.35.9"),
    "same": host("1.35.9", "1.35.9"),
    "vendor-suffix": host("1.35.9+k3s1", "1.35.9"),
    "skips-a-minor": host("1.34.3", "1.36.0"),
    "next-major": host("1.35.9", "2.0.0"),
    "downgrade": host("1.35.9", "1.35.8"),
    "minor-downgrade": host("1.35.9", "1.34.3"),
    "not-a-release": host("1.35.9", "1.36"),
    "worker-behind": host("1.35.9", "1.35.9", installed="1.34.3"),
    "worker-left-drained": host("1.35.9", "1.35.9", drained=True),
    # Its packages were upgraded (by site.yml, say) before the cluster was.
    "control-plane-behind": host("1.35.8", "1.35.9", installed="1.35.9"),
    "worker-upgraded": host("1.35.8", "1.35.9", installed="1.35.9"),
}
HOSTS["worker-without-kubectl"] = host("1.35.9", "1.35.9")
del HOSTS["worker-without-kubectl"]["_kubeadm_upgrade_package_facts"]["ansible_facts"]["packages"][
    "kubectl"
]


@pytest.fixture(scope="module")
def decided(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return role_decisions(
        tmp_path_factory.mktemp("upgrade-decisions"),
        ("kubeadm_upgrade",),
        HOSTS,
        {
            "refusal": "_kubeadm_upgrade_refusal",
            "cluster": "_kubeadm_upgrade_cluster_version",
            "due": "_kubeadm_upgrade_node_due | bool",
            "node": "_kubeadm_upgrade_node_name",
        },
        facts=True,  # the node name is the host's
        children={"control_plane": {"hosts": {"control-plane-behind": None}}},
    )


@pytest.mark.parametrize("name", ["patch", "next-minor", "same", "vendor-suffix"])
def test_a_patch_or_the_next_minor_is_allowed(decided: dict[str, Any], name: str) -> None:
    assert decided[name]["refusal"] == ""


def test_the_cluster_version_is_the_api_servers_without_its_suffix(
    decided: dict[str, Any],
) -> None:
    assert decided["vendor-suffix"]["cluster"] == "1.35.9"
    assert decided["next-minor"]["cluster"] == "1.34.3"


def test_a_skipped_minor_is_refused_with_the_step_to_take(decided: dict[str, Any]) -> None:
    assert decided["skips-a-minor"]["refusal"] == (
        "Kubernetes 1.34.3 cannot be upgraded to 1.36.0 in one step: kubeadm upgrades one minor"
        " version at a time. Upgrade to the latest 1.35 release first (kubernetes_node_version),"
        " then run this playbook again for each minor version up to 1.36.0."
    )
    assert "one minor version at a time" in decided["next-major"]["refusal"]


@pytest.mark.parametrize("name", ["downgrade", "minor-downgrade"])
def test_a_downgrade_is_refused(decided: dict[str, Any], name: str) -> None:
    assert decided[name]["refusal"].startswith(
        "The cluster runs Kubernetes 1.35.9: kubeadm does not downgrade it to 1.3"
    )


def test_a_version_that_is_no_release_is_refused(decided: dict[str, Any]) -> None:
    assert decided["not-a-release"]["refusal"] == (
        "kubeadm_upgrade_version must be a Kubernetes release such as 1.35.9, not '1.36'."
    )


def test_a_node_is_due_when_a_package_or_the_cluster_lags_or_a_run_left_it_drained(
    decided: dict[str, Any],
) -> None:
    assert decided["same"]["due"] is False
    assert decided["patch"]["due"] is True  # its packages are at 1.35.8
    assert decided["worker-behind"]["due"] is True
    assert decided["worker-left-drained"]["due"] is True
    assert decided["worker-without-kubectl"]["due"] is True
    assert decided["control-plane-behind"]["due"] is True
    assert decided["worker-upgraded"]["due"] is False  # the cluster is the control plane's business


def test_the_node_name_is_the_lower_cased_host_name(decided: dict[str, Any]) -> None:
    assert decided["same"]["node"] == platform.node().lower()
