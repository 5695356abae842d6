"""playbooks/reset.yml on the booted test nodes: remove a node, add it back, take the cluster down.

These tests end the cluster the session built, so conftest.py runs them after every other test
of the session. In order: reset.yml refuses to run unless confirmed; it takes one worker out
(drained and deleted through the control plane, then reset), a second run changes nothing;
site.yml with --limit adds that worker back (it joins again); reset.yml on the whole inventory
takes every host out, the control plane last, and removes the fetched admin kubeconfig. Test
doubles: the stand-in kubeadm and kubectl of the node harness (they record their calls; kubeadm
reset removes what its init or join wrote), as for every other node test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.nodes.harness.ansible_run import RunResult, run_playbook
from tests.nodes.harness.machine import Node
from tests.nodes.harness.provision import CONTROL_PLANE, WORKERS, Provisioned

pytestmark = [pytest.mark.nodes, pytest.mark.slow]
CONFIRM = ("-e", "kubeadm_reset_confirm=true")
REMOVED = WORKERS[-1]
REGISTERED_NODE = "/var/lib/kubeadm-standin/registered-node"
RESET = ["reset", "--force", "--cri-socket=unix:///run/containerd/containerd.sock"]


def exists(node: Node, path: str) -> bool:
    return (node.root / path.lstrip("/")).exists()


def calls(node: Node, tool: str) -> list[list[str]]:
    path = f"/var/lib/{tool}-standin/calls.jsonl"
    if not exists(node, path):
        return []
    return [json.loads(line)["argv"] for line in node.read(path).splitlines()]


def assert_ok(run: RunResult, hosts: list[str]) -> None:
    assert run.returncode == 0, run.describe()
    assert sorted(run.recap) == sorted(hosts), run.describe()
    assert run.total("failed") == 0, run.describe()


def assert_left_the_cluster(node: Node) -> None:
    assert RESET in calls(node, "kubeadm")
    for path in (
        "/etc/kubernetes/kubelet.conf",
        REGISTERED_NODE,
        "/etc/cni/net.d",
        "/etc/kubernetes/kubeadm-join.yaml",
    ):
        assert not exists(node, path), path
    assert node.run("systemctl is-enabled kubelet", check=False).stdout.strip() == "disabled"
    assert node.run("systemctl is-active kubelet", check=False).stdout.strip() == "inactive"
    # The GPU node setup stays: Docker runs, the driver and the Kubernetes packages are there.
    assert node.run("systemctl is-active docker", check=False).stdout.strip() == "active"
    assert node.run("dpkg-query -W kubeadm nvidia-container-toolkit", check=False).returncode == 0


@pytest.fixture(scope="module")
def removed_worker(
    provisioned: Provisioned, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The runs of the removal, done once: unconfirmed, confirmed, again."""
    assert provisioned.converge_run.returncode == 0, provisioned.converge_run.describe()
    logs = tmp_path_factory.mktemp("reset")
    inventory = provisioned.inventory
    # Counted from here: test_upgrade.py, run before, resets and drains nodes too.
    resets_before = calls(provisioned.cluster.node(REMOVED), "kubeadm").count(RESET)
    unconfirmed = run_playbook(
        "reset.yml", inventory, "--limit", REMOVED, log=logs / "unconfirmed.log"
    )
    resets_unconfirmed = (
        calls(provisioned.cluster.node(REMOVED), "kubeadm").count(RESET) - resets_before
    )
    first = run_playbook(
        "reset.yml", inventory, *CONFIRM, "--limit", REMOVED, log=logs / "remove.log"
    )
    resets_first = calls(provisioned.cluster.node(REMOVED), "kubeadm").count(RESET) - resets_before
    again = run_playbook(
        "reset.yml", inventory, *CONFIRM, "--limit", REMOVED, log=logs / "remove-again.log"
    )
    return {
        "unconfirmed": unconfirmed,
        "resets_unconfirmed": resets_unconfirmed,
        "resets_first": resets_first,
        "first": first,
        "again": again,
        "logs": logs,
    }


def test_reset_runs_only_when_confirmed(removed_worker: dict[str, Any]) -> None:
    run: RunResult = removed_worker["unconfirmed"]
    assert run.returncode != 0
    assert "run it with -e kubeadm_reset_confirm=true" in run.output
    assert removed_worker["resets_unconfirmed"] == 0  # nothing was reset


def test_a_worker_is_drained_deleted_and_reset(
    removed_worker: dict[str, Any], provisioned: Provisioned
) -> None:
    assert_ok(removed_worker["first"], [REMOVED])
    control_plane = provisioned.cluster.node(CONTROL_PLANE[0])
    asked = calls(control_plane, "kubectl")
    drain = [c for c in asked if c[:2] == ["drain", REMOVED]]
    assert drain
    assert "--ignore-daemonsets" in drain[-1]
    assert "--delete-emptydir-data" in drain[-1]
    assert any(c[:3] == ["delete", "node", REMOVED] for c in asked)
    assert removed_worker["resets_first"] == 1
    assert len(asked) - 1 - asked[::-1].index(drain[-1]) < max(
        i for i, c in enumerate(asked) if c[:2] == ["delete", "node"]
    )
    assert_left_the_cluster(provisioned.cluster.node(REMOVED))
    # The rest of the cluster is untouched.
    assert exists(control_plane, "/etc/kubernetes/admin.conf")
    assert exists(provisioned.cluster.node(WORKERS[0]), REGISTERED_NODE)


def test_a_second_reset_changes_nothing(removed_worker: dict[str, Any]) -> None:
    run: RunResult = removed_worker["again"]
    assert_ok(run, [REMOVED])
    assert run.recap[REMOVED]["changed"] == 0, run.describe()


def test_the_worker_joins_again_with_site_limited_to_it(
    removed_worker: dict[str, Any], provisioned: Provisioned
) -> None:
    """Adding a node: the inventory has it, site.yml --limit runs only there (the token comes
    from the control plane, outside the limit)."""
    node = provisioned.cluster.node(REMOVED)
    joins_before = sum(1 for c in calls(node, "kubeadm") if c[:1] == ["join"])
    run = run_playbook(
        "site.yml",
        provisioned.inventory,
        "--limit",
        REMOVED,
        log=removed_worker["logs"] / "add.log",
    )
    assert_ok(run, [REMOVED])
    assert sum(1 for c in calls(node, "kubeadm") if c[:1] == ["join"]) == joins_before + 1
    assert node.read(REGISTERED_NODE).strip() == REMOVED
    assert node.run("systemctl is-enabled kubelet", check=False).stdout.strip() == "enabled"


def test_the_whole_cluster_is_taken_down_control_plane_last(
    removed_worker: dict[str, Any], provisioned: Provisioned
) -> None:
    fetched = Path(provisioned.inventory).parent / "admin.conf"
    assert fetched.exists()
    control_plane = provisioned.cluster.node(CONTROL_PLANE[0])
    kubectl_before = len(calls(control_plane, "kubectl"))
    run = run_playbook(
        "reset.yml", provisioned.inventory, *CONFIRM, log=removed_worker["logs"] / "down.log"
    )
    assert_ok(run, [CONTROL_PLANE[0], *WORKERS])
    plays = run.output.split("PLAY [")
    assert plays[1].startswith("Reset the workers")
    assert plays[2].startswith("Reset the control plane")
    asked = calls(control_plane, "kubectl")[kubectl_before:]
    assert any(c[:1] == ["drain"] for c in asked)  # the workers were
    assert not any(c[:2] == ["drain", CONTROL_PLANE[0]] for c in asked)
    for node in provisioned.cluster.nodes:
        assert_left_the_cluster(node)
    for path in ("/etc/kubernetes/admin.conf", "/etc/kubernetes/kubeadm-init-succeeded"):
        assert not exists(control_plane, path), path
    assert not fetched.exists()
