"""infra.ansible_run: how KubeadmCluster hands playbooks, variables and secrets to Ansible.

The stand-in ``ansible-playbook`` (a test double: a script that records what it was given) shows
what reaches Ansible; one test runs the real ansible-playbook against localhost; the passphrase
test uses the real ssh-agent and ssh-add with a key made by ssh-keygen.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra import ansible_run

STAND_IN = """#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
record = {{"argv": args, "env": dict(os.environ)}}
def file_after(flag):
    path = args[args.index(flag) + 1].lstrip("@")
    mode = oct(os.stat(path).st_mode & 0o777)
    return path, open(path).read(), mode
record["extra_vars"] = file_after("--extra-vars")
if "--become-password-file" in args:
    record["become"] = file_after("--become-password-file")
if "SSH_AUTH_SOCK" in os.environ:
    listed = subprocess.run(["ssh-add", "-l"], capture_output=True, text=True)
    record["agent_keys"] = listed.stdout
with open({record!r}, "w") as handle:
    json.dump(record, handle)
sys.exit(int(os.environ.get("STAND_IN_EXIT", "0")))
"""


@pytest.fixture
def workspace(tmp_path: Path) -> dict[str, Path]:
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[gpu_nodes]\ngpu-1 ansible_host=192.0.2.21\n")
    playbook = tmp_path / "site.yml"
    playbook.write_text("- hosts: all\n  tasks: []\n")
    record = tmp_path / "record.json"
    stand_in = tmp_path / "ansible-playbook"
    stand_in.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    stand_in.chmod(0o755)
    return {"inventory": inventory, "playbook": playbook, "record": record, "stand_in": stand_in}


def base_environment(workspace: dict[str, Path]) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        ansible_run.ENV_INVENTORY: str(workspace["inventory"]),
        ansible_run.ENV_PLAYBOOKS: str(workspace["playbook"]),
        ansible_run.ENV_EXTRA_VARS: json.dumps({"kubeadm_cluster_name": "lab"}),
        ansible_run.ENV_ANSIBLE_PLAYBOOK: str(workspace["stand_in"]),
    }


def recorded(workspace: dict[str, Path]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(workspace["record"].read_text())
    return data


def test_secrets_reach_ansible_through_private_files_only(workspace: dict[str, Path]) -> None:
    env = {**base_environment(workspace), ansible_run.ENV_BECOME_PASSWORD: "sudo-Pa55"}
    assert ansible_run.main([], env) == 0
    record = recorded(workspace)
    argv = record["argv"]
    assert argv[:2] == ["-i", str(workspace["inventory"])]
    assert argv[-1] == str(workspace["playbook"])
    assert "sudo-Pa55" not in " ".join(argv)
    assert all("sudo-Pa55" not in value for value in record["env"].values())
    become_path, become_content, become_mode = record["become"]
    assert become_content == "sudo-Pa55"
    assert become_mode == "0o600"
    vars_path, vars_content, _ = record["extra_vars"]
    assert json.loads(vars_content) == {"kubeadm_cluster_name": "lab"}
    # The private folder is gone once Ansible has finished.
    assert not Path(become_path).exists()
    assert not Path(vars_path).parent.exists()


def test_no_become_password_means_no_become_flag(workspace: dict[str, Path]) -> None:
    assert ansible_run.main([], base_environment(workspace)) == 0
    assert "--become-password-file" not in recorded(workspace)["argv"]


def test_ansible_exit_status_is_passed_on(workspace: dict[str, Path]) -> None:
    env = {**base_environment(workspace), "STAND_IN_EXIT": "4"}
    assert ansible_run.main([], env) == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({ansible_run.ENV_INVENTORY: "/nonexistent/inventory.ini"}, "no such file"),
        ({ansible_run.ENV_PLAYBOOKS: ""}, "must be set"),
        ({ansible_run.ENV_EXTRA_VARS: "{not json"}, "is not JSON"),
        ({ansible_run.ENV_EXTRA_VARS: "[1, 2]"}, "must be a JSON object"),
    ],
)
def test_bad_configuration_is_one_error_line(
    workspace: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    change: dict[str, str],
    message: str,
) -> None:
    assert ansible_run.main([], {**base_environment(workspace), **change}) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ")
    assert message in error
    assert error.count("\n") == 1
    assert not workspace["record"].exists()


def protected_key(directory: Path, passphrase: str) -> Path:
    """A fresh ed25519 key made by the real ssh-keygen, locked with ``passphrase``."""
    key = directory / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "lab", "-f", str(key)],
        check=True,
    )
    return key


def key_environment(workspace: dict[str, Path], key: Path, passphrase: str) -> dict[str, str]:
    return {
        **base_environment(workspace),
        ansible_run.ENV_PRIVATE_KEY: str(key),
        ansible_run.ENV_KEY_PASSPHRASE: passphrase,
    }


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("ssh-agent", "ssh-add", "ssh-keygen")),
    reason="OpenSSH client tools not installed",
)
def test_key_passphrase_unlocks_the_key_in_a_private_agent(
    workspace: dict[str, Path], tmp_path: Path
) -> None:
    key = protected_key(tmp_path, "key-Pa55phrase")
    env = key_environment(workspace, key, "key-Pa55phrase")
    assert ansible_run.main([], env) == 0
    record = recorded(workspace)
    assert "ED25519" in record["agent_keys"]
    assert record["argv"][record["argv"].index("--private-key") + 1] == str(key)
    assert "key-Pa55phrase" not in json.dumps(record)


def test_wrong_key_passphrase_fails_cleanly(
    workspace: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not shutil.which("ssh-keygen"):
        pytest.skip("ssh-keygen not installed")
    key = protected_key(tmp_path, "right")
    env = key_environment(workspace, key, "wrong")
    assert ansible_run.main([], env) == 2
    assert "could not unlock" in capsys.readouterr().err
    assert not workspace["record"].exists()


@pytest.mark.slow
def test_real_ansible_playbook_receives_the_extra_vars(tmp_path: Path) -> None:
    """Real ansible-playbook (from the virtual environment) on localhost, local connection."""
    ansible = Path(sys.executable).with_name("ansible-playbook")
    if not ansible.exists():
        pytest.skip("ansible-playbook not installed in this environment")
    dest = tmp_path / "artifacts" / "lab" / "admin.conf"
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    playbook = tmp_path / "fetch.yml"
    playbook.write_text(
        "- hosts: all\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Write the kubeconfig where KubeadmCluster reads it.\n"
        "      ansible.builtin.copy:\n"
        "        dest: '{{ kubeadm_control_plane_kubeconfig_dest }}'\n"
        "        content: 'cluster: {{ kubeadm_cluster_name }}'\n"
        "        mode: '0600'\n"
    )
    dest.parent.mkdir(parents=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        ansible_run.ENV_INVENTORY: str(inventory),
        ansible_run.ENV_PLAYBOOKS: str(playbook),
        ansible_run.ENV_EXTRA_VARS: json.dumps(
            {"kubeadm_cluster_name": "lab", "kubeadm_control_plane_kubeconfig_dest": str(dest)}
        ),
    }
    assert ansible_run.main([], env) == 0
    assert dest.read_text() == "cluster: lab"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
