"""stacks/kubeadm under Pulumi mocks: the Ansible command, its triggers and secrets.

Test double: Pulumi's mock engine; the local commands are recorded, not run (infra.ansible_run,
which they run, is tested in test_ansible_run.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import ansible_run
from infra.kubeadm import KubeadmClusterArgs, gpu_node_names, tree_digest
from infra.kubeadm_inventory import InventoryError
from infra.render.program import (
    FAKE_KUBECONFIG,
    ProgramRun,
    Recorded,
    run_stack,
    stack_config,
)
from tests.infra.conftest import KUBEADM_STACK, REPO_ROOT

COMMAND = "command:local:Command"
# A cluster the playbooks can build: one control plane, a CPU worker for the cluster's services.
SMALL_CLUSTER = "[control_plane]\ncp-1 ansible_host=10.1.0.10\n[workers]\ncpu-1\ngpu-1\n"
# The example inventory as it shipped: every worker a GPU node, so every node tainted.
ALL_TAINTED = (
    "[gpu_nodes]\ngpu-1\ngpu-2\n[control_plane]\ncp-1 ansible_host=192.0.2.10\n"
    "[workers]\ngpu-1\ngpu-2\n"
)


def playbook_command(run: ProgramRun) -> Recorded:
    return run.one(COMMAND, "gpu-kubeadm-playbooks")


def environment(run: ProgramRun) -> dict[str, Any]:
    env: dict[str, Any] = playbook_command(run).inputs["environment"]
    return env


def test_command_runs_both_playbooks_against_the_inventory(kubeadm_run: ProgramRun) -> None:
    command = playbook_command(kubeadm_run).inputs
    assert command["create"].endswith(" -m infra.ansible_run")
    assert command["dir"] == str(REPO_ROOT)
    env = environment(kubeadm_run)
    assert env[ansible_run.ENV_INVENTORY] == str(KUBEADM_STACK / "inventory.example.ini")
    assert env[ansible_run.ENV_PLAYBOOKS].split(":") == [
        str(REPO_ROOT / "playbooks" / "gpu_nodes.yml"),
        str(REPO_ROOT / "playbooks" / "kubeadm_cluster.yml"),
    ]
    assert env[ansible_run.ENV_PRIVATE_KEY] == str(Path("~/.ssh/id_ed25519").expanduser())


def test_extra_vars_name_the_cluster_and_the_kubeconfig_destination(
    kubeadm_run: ProgramRun,
) -> None:
    extra_vars = json.loads(environment(kubeadm_run)[ansible_run.ENV_EXTRA_VARS])
    dest = str(REPO_ROOT / "playbooks" / "artifacts" / "gpu-lab" / "admin.conf")
    assert extra_vars == {
        "kubeadm_control_plane_pod_subnet": "10.244.0.0/16",
        "kubeadm_cluster_name": "gpu-lab",
        "kubeadm_control_plane_kubeconfig_dest": dest,
        # The address this machine reaches the API server at must be in its certificate.
        "kubeadm_control_plane_cert_sans": ["192.0.2.10"],
    }
    read = kubeadm_run.one(COMMAND, "gpu-kubeadm-kubeconfig").inputs
    assert read["create"] == f"cat {dest}"
    assert read["logging"] == "none"


def test_kubeconfig_is_a_secret_output_and_reaches_the_provider(kubeadm_run: ProgramRun) -> None:
    kubeconfig, secret = kubeadm_run.outputs["kubeconfig"]
    assert secret
    provider = kubeadm_run.one("pulumi:providers:kubernetes")
    assert "kubeconfig" in provider.secret_paths
    assert provider.inputs["kubeconfig"] == kubeconfig
    assert kubeadm_run.outputs["clusterName"] == ("gpu-lab", False)


def test_kubeconfig_points_at_the_control_plane_as_this_machine_reaches_it(
    kubeadm_run: ProgramRun,
) -> None:
    """Defect: admin.conf names the address the API server advertises, maybe a private one."""
    fetched = yaml.safe_load(FAKE_KUBECONFIG)
    kubeconfig = yaml.safe_load(kubeadm_run.outputs["kubeconfig"][0])
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://192.0.2.10:6443"
    assert kubeconfig["users"] == fetched["users"]  # nothing else changes


def test_a_control_plane_endpoint_is_used_as_is(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(
        SMALL_CLUSTER + "[control_plane:vars]\nkubeadm_control_plane_endpoint=api.lab:443\n"
    )
    run = run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)})
    kubeconfig = yaml.safe_load(run.outputs["kubeconfig"][0])
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://api.lab:443"
    extra_vars = json.loads(environment(run)[ansible_run.ENV_EXTRA_VARS])
    assert "kubeadm_control_plane_cert_sans" not in extra_vars  # kubeadm adds the endpoint


def test_an_inventory_where_system_pods_fit_nowhere_is_refused(tmp_path: Path) -> None:
    """Defect: with every node tainted, kube-prometheus-stack's install timed out after 900 s."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(ALL_TAINTED)
    with pytest.raises(InventoryError, match="every node is tainted") as raised:
        run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)})
    message = str(raised.value)
    assert "gpu-1: nvidia.com/gpu" in message
    assert "cp-1: node-role.kubernetes.io/control-plane" in message
    assert "Add a worker that is not in gpu_nodes" in message
    # The same hosts pass once the control plane takes pods.
    run = run_stack(
        KUBEADM_STACK,
        overrides={
            "inventory": str(inventory),
            "ansibleExtraVars": {"kubeadm_control_plane_schedulable": True},
        },
    )
    assert playbook_command(run)


def test_gpu_layer_is_installed_on_the_kubeadm_cluster(kubeadm_run: ProgramRun) -> None:
    charts = {r.inputs["chart"] for r in kubeadm_run.of_type("kubernetes:helm.sh/v3:Release")}
    assert charts == {
        "nvidia-device-plugin",
        "kube-prometheus-stack",
        "dcgm-exporter",
        "prometheus-adapter",
        "keda",
        "cloudnative-pg",
    }
    assert len(kubeadm_run.of_type("kubernetes:apps/v1:DaemonSet")) == 1
    values = kubeadm_run.release("kube-prometheus-stack").inputs["values"]
    assert values["prometheus"]["prometheusSpec"]["retention"] == "30d"


def test_secrets_are_pulumi_secrets_in_the_command_environment() -> None:
    run = run_stack(
        KUBEADM_STACK, secrets={"becomePassword": "sudo-Pa55", "sshKeyPassphrase": "key-Pa55"}
    )
    command = playbook_command(run)
    env = command.inputs["environment"]
    assert env[ansible_run.ENV_BECOME_PASSWORD] == "sudo-Pa55"
    assert env[ansible_run.ENV_KEY_PASSPHRASE] == "key-Pa55"
    assert command.secret_paths == {
        f"environment.{ansible_run.ENV_BECOME_PASSWORD}",
        f"environment.{ansible_run.ENV_KEY_PASSPHRASE}",
    }
    assert "sudo-Pa55" not in command.inputs["create"]
    assert "sudo-Pa55" not in json.dumps(command.inputs["triggers"])


def test_no_secret_variables_without_secret_config(kubeadm_run: ProgramRun) -> None:
    env = environment(kubeadm_run)
    assert ansible_run.ENV_BECOME_PASSWORD not in env
    assert ansible_run.ENV_KEY_PASSPHRASE not in env
    assert playbook_command(kubeadm_run).secret_paths == set()


def test_triggers_change_with_inventory_variables_and_playbooks(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(SMALL_CLUSTER)
    first = playbook_command(run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)}))
    again = playbook_command(run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)}))
    assert first.inputs["triggers"] == again.inputs["triggers"]

    inventory.write_text(SMALL_CLUSTER + "gpu-2\n")
    grown = playbook_command(run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)}))
    assert grown.inputs["triggers"][0] == first.inputs["triggers"][0]  # playbooks
    assert grown.inputs["triggers"][1] != first.inputs["triggers"][1]  # inventory

    revarred = playbook_command(
        run_stack(
            KUBEADM_STACK,
            overrides={"inventory": str(inventory), "ansibleExtraVars": {"x": 1}},
        )
    )
    assert revarred.inputs["triggers"][2] != grown.inputs["triggers"][2]  # variables


def test_playbook_digest_covers_content_and_ignores_artifacts(tmp_path: Path) -> None:
    (tmp_path / "roles" / "a" / "tasks").mkdir(parents=True)
    task = tmp_path / "roles" / "a" / "tasks" / "main.yml"
    task.write_text("- name: One.\n")
    before = tree_digest(tmp_path)
    (tmp_path / "artifacts" / "lab").mkdir(parents=True)
    (tmp_path / "artifacts" / "lab" / "admin.conf").write_text("fetched")
    assert tree_digest(tmp_path) == before
    task.write_text("- name: Two.\n")
    assert tree_digest(tmp_path) != before


def test_missing_inventory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="Ansible inventory not found"):
        run_stack(KUBEADM_STACK, overrides={"inventory": str(tmp_path / "missing.ini")})


def test_kubeconfig_dest_can_be_chosen(tmp_path: Path) -> None:
    args = KubeadmClusterArgs(
        cluster_name="lab", inventory="x", kubeconfig_dest=str(tmp_path / "kc")
    )
    assert args.all_extra_vars()["kubeadm_control_plane_kubeconfig_dest"] == str(tmp_path / "kc")


def test_inventory_folder_is_hashed_whole(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts").write_text(SMALL_CLUSTER)  # Ansible skips *.ini in a folder
    (inventory / "group_vars" / "all.yml").write_text("ansible_user: ubuntu\n")
    before = playbook_command(run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)}))
    (inventory / "group_vars" / "all.yml").write_text("ansible_user: admin\n")
    after = playbook_command(run_stack(KUBEADM_STACK, overrides={"inventory": str(inventory)}))
    assert before.inputs["triggers"][1] != after.inputs["triggers"][1]


def test_no_node_is_patched_without_gpu_node_names(kubeadm_run: ProgramRun) -> None:
    """The playbooks label and taint the gpu_nodes hosts: gpuNodeNames is optional."""
    assert "gpu-cluster-kubeadm:gpuNodeNames" not in stack_config(KUBEADM_STACK)[1]
    assert kubeadm_run.of_type("kubernetes:core/v1:NodePatch") == []


def test_listed_gpu_nodes_get_the_gpu_label() -> None:
    run = run_stack(KUBEADM_STACK, overrides={"gpuNodeNames": ["gpu-1", "gpu-2"]})
    patches = run.of_type("kubernetes:core/v1:NodePatch")
    assert {p.inputs["metadata"]["name"] for p in patches} == {"gpu-1", "gpu-2"}
    for patch in patches:
        assert patch.inputs["metadata"]["labels"] == {"nvidia.com/gpu.present": "true"}
        assert set(patch.inputs) == {"apiVersion", "kind", "metadata"}


def test_empty_gpu_node_names_patch_nothing() -> None:
    run = run_stack(KUBEADM_STACK, overrides={"gpuNodeNames": []})
    assert run.of_type("kubernetes:core/v1:NodePatch") == []


@pytest.mark.parametrize("value", ["gpu-1", [""], [1], {"gpu-1": True}])
def test_gpu_node_names_must_be_a_list_of_names(value: object) -> None:
    with pytest.raises(ValueError, match="gpuNodeNames must be a list of Kubernetes node names"):
        gpu_node_names(value)
