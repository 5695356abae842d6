"""The stand-in nvidia-mig-parted itself (tests/nodes/standin/nvidia-mig-parted), no node needed:
that it answers like the real tool's command line (github.com/NVIDIA/mig-parted, whose README and
cmd/nvidia-mig-parted are the reference), keeps its state, models GPUs in use, and that the
nvidia_mig role's default configurations are valid for it and name only profiles that the
right-sizing tables (profiler_app/reports/rightsizing/profiles.py) know for that GPU.

The stand-in's files go under a temporary root (MIG_PARTED_STANDIN_ROOT, a knob of the stand-in
only); a GPU in use is a child process holding its stand-in device open.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from profiler_app.reports.rightsizing.profiles import MODELS, GpuModel
from tests.nodes.harness.ansible_run import run_local_play
from tests.nodes.harness.standin_repo import PAYLOADS

STANDIN = PAYLOADS / "nvidia-mig-parted"
A100_80GB = {"name": "NVIDIA A100-SXM4-80GB", "device_id": "0x20B210DE", "mig_capable": True}
A100_40GB = {"name": "NVIDIA A100-SXM4-40GB", "device_id": "0x20B010DE", "mig_capable": True}
A10G = {"name": "NVIDIA A10G", "device_id": "0x223710DE", "mig_capable": False}
CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-1g.10gb:
    - device-filter: ["0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
  too-many:
    - devices: all
      mig-enabled: true
      mig-devices:
        "3g.40gb": 3
"""


class MigParted:
    """Runs the stand-in with its files under ``root``."""

    def __init__(self, root: Path, gpus: list[dict[str, object]]) -> None:
        self.root = root
        (root / "etc/nvidia-mig-parted-standin").mkdir(parents=True)
        (root / "etc/nvidia-mig-parted-standin/gpus.json").write_text(json.dumps(gpus))
        self.config = root / "config.yaml"
        self.config.write_text(CONFIG)

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(STANDIN), *args],
            env={**os.environ, "MIG_PARTED_STANDIN_ROOT": str(self.root)},
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def export(self) -> dict[str, object]:
        return dict(yaml.safe_load(self("export").stdout))

    def hold(self, gpu: int) -> subprocess.Popen[bytes]:
        """A process holding GPU ``gpu``'s stand-in device open, like a CUDA program."""
        device = self.root / f"run/nvidia-mig-parted-standin/nvidia{gpu}"
        self("export")  # creates the devices
        return subprocess.Popen(["sh", "-c", f'exec 3<"{device}"; exec sleep 60'])


@pytest.fixture
def parted(tmp_path: Path) -> MigParted:
    return MigParted(tmp_path, [A100_80GB, A100_80GB])


def test_export_of_gpus_with_mig_off_is_the_readmes_shape(parted: MigParted) -> None:
    result = parted("export")
    assert result.returncode == 0
    assert result.stdout == (
        "version: v1\nmig-configs:\n  current:\n  - devices: all\n    mig-enabled: false\n"
        "    mig-devices: {}\n"
    )


def test_apply_then_assert_with_the_readmes_messages(parted: MigParted) -> None:
    config = str(parted.config)
    missing = parted("assert", "-f", config, "-c", "all-balanced")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.rstrip().endswith(
        'level=fatal msg="Assertion failure: selected configuration not currently applied"'
    )
    applied = parted("apply", "-f", config, "-c", "all-balanced")
    assert (applied.returncode, applied.stdout) == (0, "MIG configuration applied successfully\n")
    asserted = parted("assert", "--config-file", config, "--selected-config=all-balanced")
    assert (asserted.returncode, asserted.stdout) == (
        0,
        "Selected MIG configuration currently applied\n",
    )
    assert parted.export()["mig-configs"] == {
        "current": [
            {
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
            }
        ]
    }
    mode_only = parted("assert", "-m", "-f", config, "-c", "all-1g.10gb")
    assert mode_only.stdout == "Selected MIG mode settings from configuration currently applied\n"


def test_config_from_stdin_and_environment_variables(parted: MigParted) -> None:
    result = subprocess.run(
        [sys.executable, str(STANDIN), "apply"],
        env={
            **os.environ,
            "MIG_PARTED_STANDIN_ROOT": str(parted.root),
            "MIG_PARTED_CONFIG_FILE": "-",
            "MIG_PARTED_SELECTED_CONFIG": "all-1g.10gb",
        },
        input=CONFIG,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert parted("assert", "-f", "-", "-c", "all-1g.10gb", stdin=CONFIG).returncode == 0


@pytest.mark.parametrize(
    ("text", "selected", "message"),
    [
        (CONFIG, "", "Error selecting MIG config: missing required flag 'selected-config' when"),
        (CONFIG, "nope", "Error selecting MIG config: selected mig-config not present: nope"),
        ("version: v2\nmig-configs: {}\n", "x", "unknown version: v2"),
        ("mig-configs: {a: []}\n", "a", "unable to parse with missing 'version' field"),
        (
            "version: v1\nmig-configs:\n  a:\n    - devices: all\n",
            "a",
            "missing required field: mig-enabled",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: true}\n",
            "a",
            "missing required field 'mig-devices' when 'mig-enabled' is true",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n"
            "    - {devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}\n",
            "a",
            "MIG devices included when 'mig-enabled' is false",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - {devices: some, mig-enabled: false}\n",
            "a",
            "invalid string input for 'devices': some",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n"
            "    - {devices: all, mig-enabled: true, mig-devices: {tenth: 1}}\n",
            "a",
            "invalid format for 'tenth'",
        ),
        (
            "version: v1\nmig-configs:\n  a:\n    - {devices: all, mig-enabled: false, gpu: 0}\n",
            "a",
            "unexpected field: gpu",
        ),
    ],
)
def test_bad_configs_fail_like_the_real_parser(
    parted: MigParted, text: str, selected: str, message: str
) -> None:
    args = ["assert", "-f", "-"] + (["-c", selected] if selected else [])
    result = parted(*args, stdin=text)
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith('time="')
    assert 'level=fatal msg="' in result.stderr


def test_profiles_must_fit_the_gpu(parted: MigParted) -> None:
    result = parted("apply", "-f", str(parted.config), "-c", "too-many")
    assert result.returncode == 1
    assert "Insufficient Resources" in result.stderr


def test_a_gpu_in_use_blocks_a_mode_change_and_its_repartitioning(parted: MigParted) -> None:
    config = str(parted.config)
    assert parted("apply", "-f", config, "-c", "all-balanced").returncode == 0
    holder = parted.hold(1)
    try:
        disable = parted("apply", "-f", config, "-c", "all-disabled")
        assert disable.returncode == 1
        assert "Error applying MIG configuration with hooks: error clearing existing MIG" in (
            disable.stderr
        )
        assert "In use by another client" in disable.stderr
    finally:
        holder.terminate()
        holder.wait()
    assert parted("apply", "-f", config, "-c", "all-disabled").returncode == 0
    assert parted.export()["mig-configs"]["current"][0]["mig-enabled"] is False  # type: ignore[index]


def test_a_mode_change_resets_every_gpu_and_fails_while_one_is_in_use(tmp_path: Path) -> None:
    parted = MigParted(tmp_path, [A100_80GB, A100_80GB])
    holder = parted.hold(0)
    try:
        result = parted("apply", "-f", str(parted.config), "-c", "all-1g.10gb")
    finally:
        holder.terminate()
        holder.wait()
    assert result.returncode == 1
    assert "The following GPUs could not be reset" in result.stderr
    assert result.stderr.rstrip().endswith(
        'msg="Error applying MIG configuration with hooks: error resetting all GPUs: '
        'exit status 255"'
    )
    # The mode change stays pending, as on a GPU; with the GPU free it goes through.
    assert parted("apply", "-f", str(parted.config), "-c", "all-1g.10gb").returncode == 0


def test_a_reboot_keeps_the_mode_and_loses_the_instances(parted: MigParted) -> None:
    config = str(parted.config)
    assert parted("apply", "-f", config, "-c", "all-1g.10gb").returncode == 0
    assert parted("power-cycle").returncode == 0
    assert parted("assert", "-m", "-f", config, "-c", "all-1g.10gb").returncode == 0
    assert parted("assert", "-f", config, "-c", "all-1g.10gb").returncode == 1


def test_device_filters_pick_gpus_and_every_gpu_must_match(tmp_path: Path) -> None:
    """The real assert fails unless every GPU matched an entry; export shows one entry per
    distinct layout, with device filters once GPUs of several models differ."""
    parted = MigParted(tmp_path, [A100_80GB, A100_40GB])
    config = str(parted.config)
    assert parted("apply", "-f", config, "-c", "all-1g.10gb").returncode == 0
    assert parted("assert", "-f", config, "-c", "all-1g.10gb").returncode == 1  # GPU 1 unmatched
    entries = parted.export()["mig-configs"]["current"]  # type: ignore[index]
    assert entries == [
        {
            "device-filter": "0x20B210DE",
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.10gb": 7},
        },
        {"device-filter": "0x20B010DE", "devices": "all", "mig-enabled": False, "mig-devices": {}},
    ]


def test_gpus_without_mig_are_skipped_by_all_and_refused_by_index(tmp_path: Path) -> None:
    parted = MigParted(tmp_path, [A10G])
    text = (
        "version: v1\nmig-configs:\n  all-on:\n"
        "    - {devices: all, mig-enabled: true, mig-devices: {}}\n"
        "  first:\n    - {devices: [0], mig-enabled: true, mig-devices: {}}\n"
    )
    assert parted("apply", "-f", "-", "-c", "all-on", stdin=text).returncode == 0
    refused = parted("apply", "-f", "-", "-c", "first", stdin=text)
    assert "cannot set MIG mode on non MIG-capable GPU" in refused.stderr


def test_hooks_run_around_a_change(parted: MigParted) -> None:
    marks = parted.root / "marks"
    hooks = parted.root / "hooks.yaml"
    hooks.write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "hooks": {
                    name: [{"command": "/bin/sh", "args": ["-c", f"echo {name} >> {marks}"]}]
                    for name in ("apply-start", "pre-apply-mode", "pre-apply-config", "apply-exit")
                },
            }
        )
    )
    config = str(parted.config)
    assert parted("apply", "-f", config, "-c", "all-balanced", "-k", str(hooks)).returncode == 0
    assert marks.read_text().split() == [
        "apply-start",
        "pre-apply-mode",
        "pre-apply-config",
        "apply-exit",
    ]
    marks.unlink()
    assert parted("apply", "-f", config, "-c", "all-balanced", "-k", str(hooks)).returncode == 0
    assert marks.read_text().split() == ["apply-start", "apply-exit"]  # nothing to change


def test_unknown_flags_are_refused(parted: MigParted) -> None:
    result = parted("apply", "--gpu", "0")
    assert result.returncode == 1
    assert 'msg="Flag provided but not defined: -gpu"' in result.stderr


# -- the nvidia_mig role's default configurations -----------------------------------------------


@pytest.fixture(scope="module")
def role_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The role's default configurations as Ansible renders them into config.yaml."""
    workdir = tmp_path_factory.mktemp("role")
    out = workdir / "config.yaml"
    play = f"""\
- hosts: local
  gather_facts: false
  roles: []
  vars_files:
    - {Path(__file__).resolve().parents[2]}/playbooks/roles/nvidia_mig/defaults/main.yml
    - {Path(__file__).resolve().parents[2]}/playbooks/roles/nvidia_mig/vars/main.yml
  tasks:
    - name: Render the configurations.
      ansible.builtin.copy:
        content: "{{{{ _nvidia_mig_config_text }}}}"
        dest: {out}
        mode: "0644"
"""
    inventory = {
        "all": {
            "hosts": {
                "local": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                }
            }
        }
    }
    run_local_play(workdir, inventory, play)
    return {"text": out.read_text(), "path": out}


def test_every_default_configuration_is_valid_for_nvidia_mig_parted(
    role_configs: dict[str, object], tmp_path: Path
) -> None:
    parted = MigParted(tmp_path, [A100_80GB])
    text = str(role_configs["text"])
    names = yaml.safe_load(text)["mig-configs"]
    assert {"all-disabled", "all-enabled", "all-1g.10gb", "all-balanced"} <= set(names)
    for name in names:
        result = parted("assert", "-a", "-f", "-", "-c", name, stdin=text)
        assert result.stdout == "Selected MIG configuration is valid\n", (name, result.stderr)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_the_default_configurations_fit_each_model_of_the_tables(
    role_configs: dict[str, object], tmp_path: Path, model: GpuModel
) -> None:
    """all-balanced and all-1g.10gb (where the model has 1g.10gb) apply on each model, and name
    only profiles the right-sizing table has for it."""
    ids = {
        "A100-40GB": "0x20B010DE",
        "A100-80GB": "0x20B210DE",
        "H100-SXM5-80GB": "0x233010DE",
        "H100-PCIe-80GB": "0x233110DE",
        "H200-141GB": "0x233510DE",
    }
    key = model.key
    profiles = {p.name for p in model.profiles}
    parted = MigParted(tmp_path, [{"name": key, "device_id": ids[key], "mig_capable": True}])
    text = str(role_configs["text"])
    wanted = ["all-balanced"] + (["all-1g.10gb"] if "1g.10gb" in profiles else [])
    for name in wanted:
        assert parted("apply", "-f", "-", "-c", name, stdin=text).returncode == 0, name
        layout = parted.export()["mig-configs"]["current"][0]["mig-devices"]  # type: ignore[index]
        assert set(layout) <= profiles, (name, layout)
