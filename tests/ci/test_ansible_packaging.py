"""The Ansible roles as the ecosystem packages them: argument specs, Galaxy READMEs, a collection.

Real ansible-core throughout: its role argument validation runs on every role's own defaults
(the roles' tasks replaced by a no-op in a copy, so nothing else runs, on localhost with this
machine's facts), ``ansible-galaxy collection build`` and ``install`` run offline, and
``ansible-doc`` reads the installed collection's roles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
ROLES = sorted(path.name for path in (PLAYBOOKS / "roles").iterdir() if path.is_dir())
BIN = Path(sys.executable).parent
README_SECTIONS = ("Requirements", "Role Variables", "Dependencies", "Example Playbook", "License")
PYTHON_TYPES = {"bool": bool, "int": int, "list": list, "dict": dict, "str": str}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def spec_options(role: str) -> dict[str, dict[str, Any]]:
    spec = load(PLAYBOOKS / "roles" / role / "meta" / "argument_specs.yml")
    options: dict[str, dict[str, Any]] = spec["argument_specs"]["main"]["options"] or {}
    return options


def ansible(tool: str, *arguments: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(
        [str(BIN / tool), *arguments],
        cwd=cwd,
        env={
            **os.environ,
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_declared_with_its_type(role: str) -> None:
    defaults = load(PLAYBOOKS / "roles" / role / "defaults" / "main.yml") or {}
    options = spec_options(role)
    assert set(options) == set(defaults), "meta/argument_specs.yml and defaults/main.yml differ"
    for name, option in options.items():
        assert option.get("description"), name
        value = defaults[name]
        templated = isinstance(value, str) and "{{" in value
        if option["type"] in PYTHON_TYPES and not templated:
            assert isinstance(value, PYTHON_TYPES[option["type"]]), name
        if "choices" in option and not templated:
            assert value in option["choices"], name


def validation_play(tmp_path: Path, variables: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Every role applied on localhost with its tasks replaced by a no-op: what runs is Ansible's
    own validation of the role's variables (its first task in a real run), then nothing."""
    roles = tmp_path / "roles"
    shutil.copytree(PLAYBOOKS / "roles", roles, dirs_exist_ok=True)
    for tasks in roles.glob("*/tasks/main.yml"):
        tasks.write_text("---\n- name: Do nothing.\n  ansible.builtin.meta: noop\n")
    inventory = {
        "all": {
            "hosts": {
                "gpu-host": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                }
            },
            "children": {
                group: {"hosts": {"gpu-host": {}}} for group in ("gpu_nodes", "control_plane")
            },
        }
    }
    play = [
        {
            "name": "Validate every role's variables.",
            "hosts": "gpu-host",
            "gather_facts": True,
            "vars": variables,
            "roles": [{"role": role} for role in ROLES],
        }
    ]
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "inventory.yml", "play.yml"],
        cwd=tmp_path,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_ROLES_PATH": str(roles)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_ansible_accepts_every_roles_defaults(tmp_path: Path) -> None:
    completed = validation_play(tmp_path, {})
    assert completed.returncode == 0, completed.stdout[-4000:]
    assert completed.stdout.count("Validating arguments against arg spec 'main'") == len(ROLES)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"nvidia_driver_kernel_modules": "closed"},
            "value of nvidia_driver_kernel_modules must be one of: open, proprietary",
        ),
        ({"kubeadm_control_plane_readyz_retries": "many"}, "kubeadm_control_plane_readyz_retries"),
        ({"container_runtime_docker_daemon_options": "log-driver"}, "docker_daemon_options"),
    ],
)
def test_ansible_refuses_a_wrong_variable(
    tmp_path: Path, variables: dict[str, Any], message: str
) -> None:
    completed = validation_play(tmp_path, variables)
    assert completed.returncode != 0
    assert "Validation of arguments failed" in completed.stdout
    assert message in completed.stdout


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_has_the_galaxy_sections(role: str) -> None:
    readme = (PLAYBOOKS / "roles" / role / "README.md").read_text()
    headings = [line.lstrip("#").strip() for line in readme.splitlines() if line.startswith("## ")]
    for section in README_SECTIONS:
        assert section in headings, f"{role}/README.md has no '## {section}'"
    example = readme.split("## Example Playbook", 1)[1]
    assert f"role: {role}" in example or f"- {role}" in example


@pytest.mark.parametrize("role", ROLES)
def test_role_readme_repeats_every_default(role: str) -> None:
    """The README's Role Variables show defaults/main.yml as it is (Galaxy roles' habit)."""
    defaults = load(PLAYBOOKS / "roles" / role / "defaults" / "main.yml") or {}
    if not defaults:
        pytest.skip(f"{role} has no variables")
    readme = (PLAYBOOKS / "roles" / role / "README.md").read_text()
    section = readme.split("## Role Variables", 1)[1].split("\n## ", 1)[0]
    shown: dict[str, Any] = {}
    for block in section.split("```yaml\n")[1:]:
        shown |= yaml.safe_load(block.split("```", 1)[0]) or {}
    assert shown == defaults


def test_collection_metadata_follows_the_project() -> None:
    galaxy = load(PLAYBOOKS / "galaxy.yml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert galaxy["version"] == project["version"]
    for role in ROLES:
        meta = load(PLAYBOOKS / "roles" / role / "meta" / "main.yml")
        assert meta["galaxy_info"]["namespace"] == galaxy["namespace"], role
        assert meta["galaxy_info"]["role_name"] == role


def test_the_collection_builds_installs_and_documents_its_roles(tmp_path: Path) -> None:
    built = ansible(
        "ansible-galaxy",
        "collection",
        "build",
        str(PLAYBOOKS),
        "--output-path",
        str(tmp_path / "dist"),
        cwd=tmp_path,
    )
    [archive] = (tmp_path / "dist").glob("*.tar.gz")
    assert str(archive) in built
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
        changelog = tar.getmember("CHANGELOG.md")
    for role in ROLES:
        assert f"roles/{role}/meta/argument_specs.yml" in names
        assert f"roles/{role}/tasks/main.yml" in names
    assert not {n for n in names if n.startswith(("inventory", "artifacts"))}
    assert changelog.isfile()  # the project's CHANGELOG.md, copied in
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"]) == ("gpu_cluster_profiler", "gpu_cluster")
    assert set(info["dependencies"]) == {"ansible.posix", "community.general"}

    collections = tmp_path / "collections"
    ansible(
        "ansible-galaxy",
        "collection",
        "install",
        str(archive),
        "--no-deps",
        "--collections-path",
        str(collections),
        cwd=tmp_path,
    )
    environment = {"ANSIBLE_COLLECTIONS_PATH": str(collections)}
    documented = ansible(
        "ansible-doc",
        "--type",
        "role",
        "gpu_cluster_profiler.gpu_cluster.nvidia_driver",
        cwd=tmp_path,
        env=environment,
    )
    assert "nvidia_driver_branch" in documented
    assert "Installs a pinned NVIDIA driver branch" in documented
    playbook = tmp_path / "gpu.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "GPU nodes from the collection.",
                    "hosts": "all",
                    "roles": [
                        {"role": f"gpu_cluster_profiler.gpu_cluster.{role}"}
                        for role in (
                            "nvidia_driver",
                            "nvidia_container_toolkit",
                            "container_runtime",
                        )
                    ],
                }
            ]
        )
    )
    ansible(
        "ansible-playbook",
        "--syntax-check",
        "-i",
        "localhost,",
        str(playbook),
        cwd=tmp_path,
        env=environment,
    )
