"""The stack projects' files: Pulumi.yaml runtime settings, declared config, example config,
documented keys; and that a stack takes its declared settings only.

The declarations follow the rules the Pulumi CLI applies to a project's ``config:`` (attributes
type, items, description, default, secret, value; types string, integer, boolean, array with
items; a default of its type; a key without default or value is required). The stack programs run
under Pulumi's mock engine (test double for the CLI and the cloud) with the renderer doing what
the CLI does with the declarations: defaults filled in, declared types checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.render.program import Recorded, run_stack
from infra.stack import REMOVED_SETTINGS
from infra.stack_config import declared_config
from infra.store.options import EKS_ONLY_KEYS
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK

ROOT = Path(__file__).resolve().parents[2]
STACKS = (EKS_STACK, KUBEADM_STACK)
ATTRIBUTES = {"type", "items", "description", "default", "secret", "value"}
TYPES = {"string": str, "integer": int, "boolean": bool, "array": list}
# Declared per stack on purpose: the default differs (EKS creates a StorageClass).
PER_STACK = {"prometheusStorageClass"}
# The stacks' required settings: Pulumi stops `pulumi up` without them.
REQUIRED = {"inventory"}
# The GPU layer's programs, both stacks': their keys are declared alike (but EKS_ONLY_KEYS).
SHARED_PROGRAMS = [ROOT / "infra" / "stack.py", ROOT / "infra" / "store" / "options.py"]


def declarations(stack: Path) -> dict[str, dict[str, Any]]:
    return declared_config(stack / "Pulumi.yaml")


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: s.name)
def test_every_declaration_is_one_the_pulumi_cli_accepts(stack: Path) -> None:
    for key, declaration in declarations(stack).items():
        assert set(declaration) <= ATTRIBUTES, key
        assert declaration.get("description"), f"{key} has no description"
        kind = declaration.get("type")
        if kind is not None:
            assert kind in TYPES, key
            if kind == "array":
                assert declaration["items"]["type"] in TYPES, key
            if "default" in declaration:
                default = declaration["default"]
                assert isinstance(default, TYPES[kind]), f"{key}: default {default!r} is no {kind}"
                if kind == "array":
                    item = TYPES[declaration["items"]["type"]]
                    assert all(isinstance(value, item) for value in default), key
        if declaration.get("secret"):
            # Typed secrets have their plain default refused by the CLI ("must be encrypted").
            assert kind is None, f"{key}: a secret carries no type"
            assert declaration.get("default") == "", f"{key}: an optional secret defaults to ''"
        if "default" not in declaration and "value" not in declaration:
            assert key in REQUIRED, f"{key} would be required by Pulumi: give it a default"


def test_the_gpu_layer_is_declared_alike_in_both_stacks() -> None:
    eks, kubeadm = (declarations(stack) for stack in STACKS)
    shared = set(eks) & set(kubeadm)
    layer = keys_named_in(SHARED_PROGRAMS) - EKS_ONLY_KEYS
    assert layer - set(REMOVED_SETTINGS) <= shared
    for key in shared - PER_STACK:
        assert eks[key] == kubeadm[key], key


def keys_read(stack_dir: Path) -> set[str]:
    read = keys_named_in([stack_dir / "__main__.py", *SHARED_PROGRAMS])
    return read if stack_dir == EKS_STACK else read - EKS_ONLY_KEYS


def keys_named_in(paths: list[Path]) -> set[str]:
    """Config keys the code reads: first arguments of config.get*/require* and read_object."""
    pattern = re.compile(
        r"(?:config\.(?:get|require)\w*|stack_config\.(?:read_object|optional_\w+))"
        r"\(\s*(?:config,\s*)?\"(\w+)\""
    )
    return {key for path in paths for key in pattern.findall(path.read_text())}


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: s.name)
def test_every_setting_read_is_declared_and_every_declared_one_read(stack: Path) -> None:
    read = keys_read(stack)
    declared = set(declarations(stack))
    assert read - set(REMOVED_SETTINGS) <= declared, "read but not declared in Pulumi.yaml"
    assert declared <= read, "declared in Pulumi.yaml but never read"


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: s.name)
def test_a_run_reads_only_declared_settings(stack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, at run time: every key the program asks its config for (patched into
    ``Config.full_key``, which every getter calls) is declared."""
    asked: set[str] = set()
    original = pulumi.Config.full_key

    def recording(self: pulumi.Config, key: str) -> str:
        if self.name.startswith("gpu-cluster-"):
            asked.add(key)
        return original(self, key)

    monkeypatch.setattr(pulumi.Config, "full_key", recording)
    run_stack(stack)
    assert asked
    assert asked - set(REMOVED_SETTINGS) <= set(declarations(stack))


def minimal_stack_file(stack: Path, tmp_path: Path) -> Path:
    """A stack file that sets only what a stack needs: each declared default then applies."""
    project = yaml.safe_load((stack / "Pulumi.yaml").read_text())["name"]
    required = {"aws:region": "us-west-2"} if stack == EKS_STACK else {}
    # Karpenter's GPU limit bounds what it may cost: it has no default, so a stack must set it.
    required |= {f"{project}:karpenter": {"gpuLimit": 8}} if stack == EKS_STACK else {}
    inventory = (stack / "inventory.example.ini").resolve()
    required |= {f"{project}:inventory": str(inventory)} if stack == KUBEADM_STACK else {}
    path = tmp_path / "Pulumi.minimal.yaml"
    path.write_text(yaml.safe_dump({"config": required}))
    return path


def resources(records: list[Recorded]) -> dict[tuple[str, str], Any]:
    """Inputs by type and name (the mock engine registers resources in no fixed order)."""
    return {(r.typ, r.name): r.inputs for r in records}


@pytest.mark.parametrize("stack", STACKS, ids=lambda s: s.name)
def test_declared_defaults_are_the_programs_own(stack: Path, tmp_path: Path) -> None:
    """The stack with every setting at its declared default (what `pulumi up` runs) declares the
    very resources the program makes of unset settings: the two defaults cannot drift apart."""
    stack_file = minimal_stack_file(stack, tmp_path)
    with_defaults = run_stack(stack, config_file=stack_file)
    without = run_stack(stack, config_file=stack_file, project_defaults=False)
    assert resources(with_defaults.resources) == resources(without.resources)
    assert len(with_defaults.resources) > 20


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "clustrName",
            "stack config clustrName is not a setting of gpu-cluster-eks: did you mean "
            "clusterName? Pulumi.yaml declares them all",
        ),
        ("grafanaPasword", "did you mean grafanaAdminPassword?"),
        (
            "shinyNewThing",
            "stack config shinyNewThing is not a setting of gpu-cluster-eks: "
            "Pulumi.yaml declares them all",
        ),
        ("exampleHpa", "stack config exampleHpa is gone: set workloadAutoscaler: hpa"),
    ],
)
def test_an_unknown_setting_is_refused_in_one_line(key: str, message: str) -> None:
    with pytest.raises(pulumi.RunError, match=re.escape(message)) as refused:
        run_stack(EKS_STACK, overrides={key: "gpu-dev"})
    assert "\n" not in str(refused.value)


def test_other_namespaces_are_not_the_stacks_to_judge() -> None:
    """aws:region, kubernetes:... belong to their providers; only the project's keys are checked."""
    run = run_stack(EKS_STACK, overrides={"kubernetes:enableServerSideApply": "true"})
    assert run.resources


def test_a_declared_type_is_checked_like_the_cli_does() -> None:
    with pytest.raises(ValueError, match="gpuMetricsIntervalSeconds must be of type integer"):
        run_stack(EKS_STACK, overrides={"gpuMetricsIntervalSeconds": "ten"})
    with pytest.raises(ValueError, match="publicAccessCidrs must be of type array"):
        run_stack(EKS_STACK, overrides={"publicAccessCidrs": "10.0.0.0/8"})


def test_a_required_setting_missing_is_said(tmp_path: Path) -> None:
    stack_file = tmp_path / "Pulumi.empty.yaml"
    stack_file.write_text("config: {}\n")
    with pytest.raises(ValueError, match="missing configuration value\\(s\\) inventory"):
        run_stack(KUBEADM_STACK, config_file=stack_file)


@pytest.mark.parametrize("key", ["grafanaAdminPassword", "profilerStoreUrl"])
def test_an_empty_secret_is_no_secret(key: str) -> None:
    """Optional secrets default to "" in Pulumi.yaml: that is unset, never an empty password or
    store URL."""
    run = run_stack(EKS_STACK)
    explicit = run_stack(EKS_STACK, secrets={key: ""})
    assert resources(run.resources) == resources(explicit.resources)
    if key == "grafanaAdminPassword":
        assert run.of_type("random:index/randomPassword:RandomPassword")


@pytest.mark.parametrize("stack_dir", STACKS, ids=lambda p: p.name)
def test_project_uses_python_and_the_repository_venv(stack_dir: Path) -> None:
    project = yaml.safe_load((stack_dir / "Pulumi.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    venv = (stack_dir / project["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == ROOT / ".venv"


@pytest.mark.parametrize("stack_dir", STACKS, ids=lambda p: p.name)
def test_example_config_has_no_unknown_keys(stack_dir: Path) -> None:
    project = yaml.safe_load((stack_dir / "Pulumi.yaml").read_text())["name"]
    config = yaml.safe_load((stack_dir / "Pulumi.example.yaml").read_text())["config"]
    ours = {key.split(":", 1)[1] for key in config if key.startswith(f"{project}:")}
    assert ours
    assert ours <= set(declarations(stack_dir))


@pytest.mark.parametrize("stack_dir", STACKS, ids=lambda p: p.name)
def test_every_config_key_is_documented(stack_dir: Path) -> None:
    readme = (ROOT / "stacks" / "README.md").read_text()
    undocumented = {key for key in declarations(stack_dir) if f"`{key}`" not in readme}
    assert undocumented == set()
