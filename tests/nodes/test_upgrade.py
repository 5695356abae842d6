"""playbooks/upgrade_kubernetes.yml on the booted test nodes: a kubeadm cluster one minor up.

The session's cluster is taken down (reset.yml) and built again at the previous minor version,
1.34.3, from that minor's own stand-in repository (as pkgs.k8s.io has one per minor). Then: a check
run changes nothing; asking for 1.36.0 (a skipped minor) is refused with one message before
anything changes; kubeadm_cluster.yml at 1.35.9 (as site.yml would apply it) stops on every joined
node before a package moves; the upgrade to 1.35.9 runs, control plane first (`kubeadm upgrade
plan` and `apply`), then each worker alone (`kubeadm upgrade node`), every node drained before its
kubelet is upgraded and uncordoned and Ready after it; a rerun changes nothing; a downgrade is
refused.
The cluster ends as the session built it (1.35.9), for test_reset.py, which conftest.py runs after
this module. Test doubles: the stand-in kubeadm (it keeps the cluster's version and applies real
kubeadm's version rules), kubectl (it records drain, uncordon and wait: no API server keeps the
other nodes' state, so the order of the calls is what is checked) and the stand-in packages of both
minors (tests/nodes/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.nodes.harness import standin_repo
from tests.nodes.harness.ansible_run import RunResult, run_playbook
from tests.nodes.harness.machine import Node
from tests.nodes.harness.provision import CONTROL_PLANE, WORKERS, Provisioned

pytestmark = [pytest.mark.nodes, pytest.mark.slow]
OLD = standin_repo.KUBERNETES_PREVIOUS_VERSIONS[-1]
NEW = "1.35.9"
PACKAGES = ("kubeadm", "kubelet", "kubectl")
STATE = "/var/lib/kubeadm-standin"


def calls(node: Node, tool: str) -> list[dict[str, Any]]:
    path = node.root / f"var/lib/{tool}-standin/calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def versions(node: Node) -> dict[str, str]:
    """Each Kubernetes package's installed version and selection (install or hold)."""
    shown = node.run(
        "dpkg-query -W -f '${Package} ${Version} ${Status}\\n' " + " ".join(PACKAGES)
    ).stdout
    return {line.split()[0]: " ".join(line.split()[1:3]) for line in shown.splitlines()}


def cluster_version(provisioned: Provisioned) -> str:
    return provisioned.cluster.node(CONTROL_PLANE[0]).read(f"{STATE}/cluster-version").strip()


def run(provisioned: Provisioned, logs: Path, name: str, *extra: str) -> RunResult:
    return run_playbook(
        "upgrade_kubernetes.yml", provisioned.inventory, *extra, log=logs / f"{name}.log"
    )


def upgrade_calls(provisioned: Provisioned) -> int:
    """kubeadm upgrade apply/node, drain and uncordon calls so far, on every node."""
    cluster = provisioned.cluster
    kubeadm = sum(
        1 for node in cluster.nodes for c in calls(node, "kubeadm") if c["argv"][:1] == ["upgrade"]
    )
    kubectl = sum(
        1
        for c in calls(cluster.node(CONTROL_PLANE[0]), "kubectl")
        if c["argv"][:1] in (["drain"], ["uncordon"])
    )
    return kubeadm + kubectl


@pytest.fixture(scope="module")
def upgraded(provisioned: Provisioned, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The runs, done once: the old cluster, check, refusal, upgrade, rerun, downgrade."""
    assert provisioned.converge_run.returncode == 0, provisioned.converge_run.describe()
    logs = tmp_path_factory.mktemp("upgrade")
    inventory = provisioned.inventory
    down = run_playbook(
        "reset.yml", inventory, "-e", "kubeadm_reset_confirm=true", log=logs / "down.log"
    )
    assert down.returncode == 0, down.describe()
    old = run_playbook(
        "kubeadm_cluster.yml",
        inventory,
        "-e",
        f"kubernetes_node_version={OLD}",
        log=logs / "old.log",
    )
    assert old.returncode == 0, old.describe()
    nodes = provisioned.cluster.nodes
    result: dict[str, Any] = {"old": old, "old_versions": {n.name: versions(n) for n in nodes}}
    result["old_cluster"] = cluster_version(provisioned)
    before = upgrade_calls(provisioned)
    result["check"] = run(
        provisioned, logs, "check", "--check", "-e", f"kubernetes_node_version={NEW}"
    )
    result["after_check"] = {n.name: versions(n) for n in nodes}
    result["skip"] = run(provisioned, logs, "skip", "-e", "kubernetes_node_version=1.36.0")
    # The version raised and the cluster playbook applied, as site.yml would: the nodes refuse.
    result["unmanaged"] = run_playbook(
        "kubeadm_cluster.yml",
        inventory,
        "-e",
        f"kubernetes_node_version={NEW}",
        log=logs / "unmanaged.log",
    )
    result["after_refusals"] = {n.name: versions(n) for n in nodes}
    result["calls_before_upgrade"] = (before, upgrade_calls(provisioned))
    result["cluster_before_upgrade"] = cluster_version(provisioned)
    result["started"] = provisioned.cluster.node(CONTROL_PLANE[0]).run("date +%s.%N").stdout
    result["upgrade"] = run(provisioned, logs, "upgrade", "-e", f"kubernetes_node_version={NEW}")
    result["rerun"] = run(provisioned, logs, "rerun", "-e", f"kubernetes_node_version={NEW}")
    result["downgrade"] = run(
        provisioned, logs, "downgrade", "-e", "kubernetes_node_version=1.35.8"
    )
    return result


def test_the_old_cluster_runs_the_previous_minor(upgraded: dict[str, Any]) -> None:
    assert upgraded["old_cluster"] == f"v{OLD}"
    for name, installed in upgraded["old_versions"].items():
        for package in PACKAGES:
            assert installed[package] == f"{OLD}-1.1 hold", (name, installed)


def test_a_check_run_changes_nothing(upgraded: dict[str, Any]) -> None:
    check: RunResult = upgraded["check"]
    assert check.returncode == 0, check.describe()
    assert check.total("failed") == 0, check.describe()
    assert upgraded["after_check"] == upgraded["old_versions"]
    assert upgraded["cluster_before_upgrade"] == f"v{OLD}"


def test_skipping_a_minor_is_refused_with_one_message_before_anything_changes(
    upgraded: dict[str, Any],
) -> None:
    skip: RunResult = upgraded["skip"]
    assert skip.returncode != 0
    assert (
        f"Kubernetes {OLD} cannot be upgraded to 1.36.0 in one step: kubeadm upgrades one minor"
        " version at a time. Upgrade to the latest 1.35 release first" in skip.output
    ), skip.describe()
    assert skip.total("changed") == 0, skip.describe()
    assert upgraded["after_refusals"] == upgraded["old_versions"]
    before, after = upgraded["calls_before_upgrade"]
    assert after == before  # neither the check run nor the refusal drained or upgraded anything


def test_the_cluster_playbook_refuses_to_change_a_joined_nodes_version(
    upgraded: dict[str, Any],
) -> None:
    unmanaged: RunResult = upgraded["unmanaged"]
    assert unmanaged.returncode != 0
    for name in [*CONTROL_PLANE, *WORKERS]:
        assert (
            f"{name} has joined a cluster with kubelet {OLD} and kubernetes_node_version asks for"
            f" {NEW}: applied here" in unmanaged.output
        ), unmanaged.describe()
        assert unmanaged.recap[name]["failed"] == 1, unmanaged.describe()
    assert "Run playbooks/upgrade_kubernetes.yml" in unmanaged.output
    assert upgraded["after_refusals"] == upgraded["old_versions"]  # no package moved
    before, after = upgraded["calls_before_upgrade"]
    assert after == before


def test_every_node_runs_the_new_version_held(
    upgraded: dict[str, Any], provisioned: Provisioned
) -> None:
    run: RunResult = upgraded["upgrade"]
    assert run.returncode == 0, run.describe()
    assert sorted(run.recap) == sorted([*CONTROL_PLANE, *WORKERS]), run.describe()
    assert cluster_version(provisioned) == f"v{NEW}"
    for node in provisioned.cluster.nodes:
        installed = versions(node)
        for package in PACKAGES:
            assert installed[package] == f"{NEW}-1.1 hold", (node.name, installed)
        sources = node.read("/etc/apt/sources.list.d/kubernetes.sources")
        assert f"/core:/stable:/v{NEW.rsplit('.', 1)[0]}/deb/" in sources, sources
        assert node.run("systemctl is-active kubelet", check=False).stdout.strip() == "active"


def test_the_control_plane_goes_first_then_one_worker_at_a_time(
    upgraded: dict[str, Any], provisioned: Provisioned
) -> None:
    started = float(upgraded["started"])
    cluster = provisioned.cluster
    control_plane = cluster.node(CONTROL_PLANE[0])
    kubectl = [c for c in calls(control_plane, "kubectl") if c["time"] >= started]
    steps: list[tuple[float, str, str]] = []
    for node in cluster.nodes:
        for call in calls(node, "kubeadm"):
            if call["time"] >= started and call["argv"][:1] == ["upgrade"]:
                steps.append((call["time"], node.name, f"kubeadm upgrade {call['argv'][1]}"))
        for call in kubectl:
            argv = call["argv"]
            if argv[:2] in (["drain", node.name], ["uncordon", node.name]):
                steps.append((call["time"], node.name, argv[0]))
            if argv[:1] == ["wait"] and f"node/{node.name}" in argv:
                assert "--for=condition=Ready" in argv
                steps.append((call["time"], node.name, "ready"))
    order = [(name, step) for _, name, step in sorted(steps)]
    expected = [
        (CONTROL_PLANE[0], "kubeadm upgrade plan"),
        (CONTROL_PLANE[0], "kubeadm upgrade apply"),
        (CONTROL_PLANE[0], "drain"),
        (CONTROL_PLANE[0], "uncordon"),
        (CONTROL_PLANE[0], "ready"),
    ]
    for worker in WORKERS:
        expected += [
            (worker, "kubeadm upgrade node"),
            (worker, "drain"),
            (worker, "uncordon"),
            (worker, "ready"),
        ]
    assert order == expected
    drains = [c["argv"] for c in kubectl if c["argv"][:1] == ["drain"]]
    for argv in drains:
        assert "--ignore-daemonsets" in argv, argv
        assert "--delete-emptydir-data" in argv, argv
        assert any(arg.startswith("--timeout=") for arg in argv), argv
    apply = next(
        c["argv"]
        for c in calls(control_plane, "kubeadm")
        if c["time"] >= started and c["argv"][:2] == ["upgrade", "apply"]
    )
    assert apply[2:] == ["--yes", f"v{NEW}"]
    for worker in WORKERS:
        # kubeadm upgrade node ran from the new kubeadm (the stand-in records its own version).
        assert cluster.node(worker).read(f"{STATE}/node-version").strip() == f"v{NEW}"


def test_each_kubelet_is_upgraded_and_restarted_while_its_node_is_drained(
    upgraded: dict[str, Any], provisioned: Provisioned
) -> None:
    started = float(upgraded["started"])
    kubectl = calls(provisioned.cluster.node(CONTROL_PLANE[0]), "kubectl")
    for node in provisioned.cluster.nodes:
        drained = max(
            c["time"]
            for c in kubectl
            if c["argv"][:2] == ["drain", node.name] and c["time"] >= started
        )
        uncordoned = max(c["time"] for c in kubectl if c["argv"][:2] == ["uncordon", node.name])
        installed = [
            line.split()
            for line in node.read("/var/log/dpkg.log").splitlines()
            if f" status installed kubelet:amd64 {NEW}-1.1" in line
        ]
        assert installed, node.name
        moment = node.run(f"date -d '{installed[-1][0]} {installed[-1][1]}' +%s").stdout
        # dpkg.log has whole seconds.
        assert int(drained) <= int(moment) <= uncordoned, (node.name, drained, moment, uncordoned)
        restarted = node.run(
            "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value kubelet"
        ).stdout.strip()
        assert int(drained) <= int(restarted.lstrip("@")) <= uncordoned, (node.name, restarted)


def test_a_rerun_at_the_new_version_changes_nothing(upgraded: dict[str, Any]) -> None:
    rerun: RunResult = upgraded["rerun"]
    assert rerun.returncode == 0, rerun.describe()
    assert rerun.total("failed") == 0, rerun.describe()
    assert rerun.total("changed") == 0, rerun.describe()


def test_a_downgrade_is_refused(upgraded: dict[str, Any], provisioned: Provisioned) -> None:
    downgrade: RunResult = upgraded["downgrade"]
    assert downgrade.returncode != 0
    assert (
        f"The cluster runs Kubernetes {NEW}: kubeadm does not downgrade it to 1.35.8"
        in downgrade.output
    ), downgrade.describe()
    assert downgrade.total("changed") == 0
    assert cluster_version(provisioned) == f"v{NEW}"
