"""The stack projects' files: Pulumi.yaml runtime settings, example config, documented keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.infra.conftest import EKS_STACK, KUBEADM_STACK, REPO_ROOT

CONFIG_READ = re.compile(
    r"(?:config\.(?:get|require)(?:_secret|_object|_int|_bool)?\(|read_object\(config,)\s*\"(\w+)\""
)
SHARED_PROGRAM = REPO_ROOT / "infra" / "stack.py"


def keys_read(stack_dir: Path) -> set[str]:
    text = (stack_dir / "__main__.py").read_text() + SHARED_PROGRAM.read_text()
    return set(CONFIG_READ.findall(text))


@pytest.mark.parametrize("stack_dir", [EKS_STACK, KUBEADM_STACK], ids=lambda p: p.name)
def test_project_uses_python_and_the_repository_venv(stack_dir: Path) -> None:
    project = yaml.safe_load((stack_dir / "Pulumi.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    venv = (stack_dir / project["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == REPO_ROOT / ".venv"


@pytest.mark.parametrize("stack_dir", [EKS_STACK, KUBEADM_STACK], ids=lambda p: p.name)
def test_example_config_has_no_unknown_keys(stack_dir: Path) -> None:
    project = yaml.safe_load((stack_dir / "Pulumi.yaml").read_text())["name"]
    config = yaml.safe_load((stack_dir / "Pulumi.dev.yaml").read_text())["config"]
    ours = {key.split(":", 1)[1] for key in config if key.startswith(f"{project}:")}
    assert ours
    assert ours <= keys_read(stack_dir)


@pytest.mark.parametrize("stack_dir", [EKS_STACK, KUBEADM_STACK], ids=lambda p: p.name)
def test_every_config_key_is_documented(stack_dir: Path) -> None:
    readme = (REPO_ROOT / "stacks" / "README.md").read_text()
    undocumented = {key for key in keys_read(stack_dir) if f"`{key}`" not in readme}
    assert undocumented == set()
