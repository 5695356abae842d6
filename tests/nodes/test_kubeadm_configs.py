"""The kubeadm configurations the roles write, rendered by real Ansible for many kinds of host.

No node is booted (no root needed): Ansible renders the roles' own templates with their own
defaults and vars on localhost, for hosts in and out of gpu_nodes and with the switches flipped.
The booted cluster (test_standin_cluster.py) checks the configs kubeadm was really given.
Test double: a made-up `kubeadm token create --print-join-command` line for the join config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.gpu import (
    GPU_NODE_LABEL_KEY,
    GPU_NODE_LABEL_VALUE,
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
)
from tests.nodes.harness.ansible_run import PLAYBOOKS, role_variables, run_local_play

ROLES = PLAYBOOKS / "roles"
GPU_LABEL = f"{GPU_NODE_LABEL_KEY}={GPU_NODE_LABEL_VALUE}"
GPU_TAINT = {"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}
CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
JOIN_LINE = (
    "kubeadm join 192.0.2.10:6443 --token abcdef.0123456789abcdef "
    "--discovery-token-ca-cert-hash sha256:" + "0" * 64
)

# Host name -> (groups, host variables).
HOSTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "gpu": (["gpu_nodes"], {}),
    "cpu": ([], {}),
    "gpu-schedulable": (["gpu_nodes"], {"kubeadm_control_plane_schedulable": True}),
    "cpu-schedulable": ([], {"kubeadm_control_plane_schedulable": True}),
    "gpu-untainted": (
        ["gpu_nodes"],
        {
            "kubeadm_control_plane_gpu_node_taint_enabled": False,
            "kubeadm_worker_gpu_node_taint_enabled": False,
        },
    ),
    "cpu-marked-gpu": (
        [],
        {"kubeadm_control_plane_gpu_node": True, "kubeadm_worker_gpu_node": True},
    ),
    "gpu-1-30": (["gpu_nodes"], {"kubernetes_node_version": "1.30.5"}),
}

PLAYBOOK = """
- name: Render the kubeadm configurations.
  hosts: all
  gather_facts: false
  tasks:
    - name: Render the InitConfiguration.
      ansible.builtin.template:
        src: {roles}/kubeadm_control_plane/templates/kubeadm-config.yaml.j2
        dest: "{out}/{{{{ inventory_hostname }}}}-init.yaml"
        mode: "0600"
    - name: Render the JoinConfiguration.
      ansible.builtin.template:
        src: {roles}/kubeadm_worker/templates/kubeadm-join.yaml.j2
        dest: "{out}/{{{{ inventory_hostname }}}}-join.yaml"
        mode: "0600"
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("kubeadm-configs")
    out = workdir / "out"
    out.mkdir()
    groups: dict[str, Any] = {"gpu_nodes": {"hosts": {}}}
    hosts: dict[str, Any] = {}
    for name, (member_of, host_vars) in HOSTS.items():
        hosts[name] = host_vars
        for group in member_of:
            groups[group]["hosts"][name] = {}
    inventory = {
        "all": {
            "vars": {
                **role_variables("kubeadm_control_plane", "kubeadm_worker"),
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "_kubeadm_worker_join_command": {"stdout": JOIN_LINE},
            },
            "hosts": hosts,
            "children": groups,
        }
    }
    run_local_play(workdir, inventory, PLAYBOOK.format(roles=ROLES, out=out))
    return out


def _registration(rendered: Path, host: str, kind: str) -> dict[str, Any]:
    suffix = "init" if kind == "InitConfiguration" else "join"
    documents = yaml.safe_load_all((rendered / f"{host}-{suffix}.yaml").read_text())
    (document,) = [d for d in documents if d["kind"] == kind]
    registration: dict[str, Any] = document["nodeRegistration"]
    return registration


def _node_labels(registration: dict[str, Any]) -> list[str]:
    """kubelet's node-labels argument, from v1beta4's list or v1beta3's map."""
    extra = registration.get("kubeletExtraArgs", [])
    if isinstance(extra, dict):
        return [extra["node-labels"]] if "node-labels" in extra else []
    return [arg["value"] for arg in extra if arg["name"] == "node-labels"]


@pytest.mark.parametrize(
    ("host", "labels", "taints"),
    [
        ("gpu", [GPU_LABEL], [CONTROL_PLANE_TAINT, GPU_TAINT]),
        ("cpu", [], [CONTROL_PLANE_TAINT]),
        ("gpu-schedulable", [GPU_LABEL], [GPU_TAINT]),
        ("cpu-schedulable", [], []),
        ("gpu-untainted", [GPU_LABEL], [CONTROL_PLANE_TAINT]),
        ("cpu-marked-gpu", [GPU_LABEL], [CONTROL_PLANE_TAINT, GPU_TAINT]),
        ("gpu-1-30", [GPU_LABEL], [CONTROL_PLANE_TAINT, GPU_TAINT]),
    ],
)
def test_init_configuration_registers_gpu_hosts_with_label_and_taint(
    rendered: Path, host: str, labels: list[str], taints: list[dict[str, str]]
) -> None:
    registration = _registration(rendered, host, "InitConfiguration")
    assert _node_labels(registration) == labels
    # Always explicit: a taints list replaces kubeadm's default control-plane taint.
    assert registration["taints"] == taints
    assert registration["criSocket"] == "unix:///run/containerd/containerd.sock"


@pytest.mark.parametrize(
    ("host", "labels", "taints"),
    [
        ("gpu", [GPU_LABEL], [GPU_TAINT]),
        ("cpu", [], None),
        ("gpu-untainted", [GPU_LABEL], None),
        ("cpu-marked-gpu", [GPU_LABEL], [GPU_TAINT]),
        ("gpu-1-30", [GPU_LABEL], [GPU_TAINT]),
    ],
)
def test_join_configuration_registers_gpu_hosts_with_label_and_taint(
    rendered: Path, host: str, labels: list[str], taints: list[dict[str, str]] | None
) -> None:
    registration = _registration(rendered, host, "JoinConfiguration")
    assert _node_labels(registration) == labels
    assert registration.get("taints") == taints


@pytest.mark.parametrize(
    ("host", "api_version", "extra_args_type"),
    [("gpu", "kubeadm.k8s.io/v1beta4", list), ("gpu-1-30", "kubeadm.k8s.io/v1beta3", dict)],
)
def test_kubelet_extra_args_follow_the_kubeadm_api_version(
    rendered: Path, host: str, api_version: str, extra_args_type: type
) -> None:
    for suffix in ("init", "join"):
        document = next(yaml.safe_load_all((rendered / f"{host}-{suffix}.yaml").read_text()))
        assert document["apiVersion"] == api_version
        assert isinstance(document["nodeRegistration"]["kubeletExtraArgs"], extra_args_type)


# Host -> (kubelet.conf exists, kubectl get node's exit status, its stderr: real kubectl's words).
WORKER_STATES: dict[str, tuple[bool, int, str]] = {
    "new": (False, 1, ""),
    "joined": (True, 0, ""),
    "half-joined": (True, 1, 'Error from server (NotFound): nodes "gpu-worker-2" not found'),
    "half-joined-credentials": (
        True,
        1,
        "error: You must be logged in to the server (Unauthorized)",
    ),
    "unknown": (
        True,
        1,
        "The connection to the server 192.0.2.10:6443 was refused"
        " - did you specify the right host or port?",
    ),
}


def test_a_worker_rejoins_only_when_the_api_server_says_it_does_not_know_the_node(
    tmp_path: Path,
) -> None:
    # A control plane that does not answer must not get a healthy worker reset.
    hosts = {
        name: {
            "_kubeadm_worker_kubelet_conf": {"stat": {"exists": exists}},
            "_kubeadm_worker_registration": {"rc": rc, "stderr": stderr},
        }
        for name, (exists, rc, stderr) in WORKER_STATES.items()
    }
    inventory = {
        "all": {
            "vars": {
                **role_variables("kubeadm_worker"),
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
            },
            "hosts": hosts,
        }
    }
    run_local_play(
        tmp_path,
        inventory,
        "- name: Decide.\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Write the state.\n      ansible.builtin.copy:\n"
        '        content: "{{ _kubeadm_worker_state | trim }}"\n'
        f'        dest: "{tmp_path}/{{{{ inventory_hostname }}}}.state"\n'
        '        mode: "0600"\n',
    )
    states = {name: (tmp_path / f"{name}.state").read_text() for name in WORKER_STATES}
    assert states == {
        "new": "new",
        "joined": "joined",
        "half-joined": "half-joined",
        "half-joined-credentials": "half-joined",
        "unknown": "unknown",
    }
