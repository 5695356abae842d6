"""The container_runtime role's containerd configuration against real containerd 1.7 and 2.x.

The booted nodes run Debian 12's containerd 1.6 (the stand-in `containerd.io` depends on it),
while Docker's repository serves `containerd.io` 1.7.x and 2.x. Those packages cannot be reached
here, but Debian's archive ships the same upstream daemons: trixie's `containerd` 1.7.24 and sid's
2.1.9 (Debian's Packages indexes, fetched when the test runs). Ansible renders the role's real
template for the version string each binary prints; the real binary then shows what it loaded
(`containerd config dump`), and, as root, starts with it in a scratch directory: its CRI plugins
must load (`ctr plugins ls`) without migrating the configuration.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import tomllib
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nodes.harness import rootfs, standin_repo
from tests.nodes.harness.ansible_run import PLAYBOOKS, role_variables, run_local_play

pytestmark = pytest.mark.slow
TEMPLATE = PLAYBOOKS / "roles/container_runtime/templates/containerd-config.toml.j2"
# Debian suite -> the upstream minor version it ships.
SUITES = {"trixie": "1.7", "sid": "2."}
SANDBOX = "registry.k8s.io/pause:3.10"


@pytest.fixture(scope="module", params=list(SUITES))
def containerd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's real containerd binaries, unpacked (the .deb kept in the test cache)."""
    suite = str(request.param)
    cache = rootfs.CACHE_DIR / "debian-containerd"
    try:
        deb = standin_repo.fetch_debian_deb("containerd", "", cache, suite)
    except (urllib.error.URLError, OSError) as error:
        pytest.skip(f"Debian's {suite} containerd cannot be fetched: {error}")
    tree = tmp_path_factory.mktemp(f"containerd-{suite}")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    binary = tree / "usr/bin/containerd"
    assert SUITES[suite] in subprocess.check_output([binary, "--version"], text=True)
    return binary


def render(workdir: Path, version_line: str) -> Path:
    """The role's containerd config.toml for a GPU node whose `containerd --version` printed
    version_line (the role's defaults, as on a node of gpu_nodes)."""
    dest = workdir / "config.toml"
    inventory = {
        "all": {
            "vars": {
                **role_variables("container_runtime"),
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
            },
            "hosts": {"gpu-host": {}},
            "children": {"gpu_nodes": {"hosts": {"gpu-host": {}}}},
        }
    }
    play = f"""
- hosts: gpu-host
  gather_facts: false
  vars:
    _container_runtime_versions: {{stdout: "{version_line}"}}
  tasks:
    - ansible.builtin.template:
        src: {TEMPLATE}
        dest: {dest}
        mode: "0644"
"""
    run_local_play(workdir, inventory, play)
    return dest


def cri_sections(dumped: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The CRI runtime settings and the sandbox image: containerd 1.7 keeps both in the cri
    plugin, 2.x splits it into cri.v1.runtime and cri.v1.images."""
    plugins = dumped["plugins"]
    if "io.containerd.cri.v1.runtime" in plugins:
        images = plugins["io.containerd.cri.v1.images"]
        return plugins["io.containerd.cri.v1.runtime"], images["pinned_images"]["sandbox"]
    cri = plugins["io.containerd.grpc.v1.cri"]
    return cri, cri["sandbox_image"]


@pytest.fixture
def rendered(containerd: Path, tmp_path: Path) -> tuple[Path, str]:
    version_line = subprocess.check_output([containerd, "--version"], text=True).strip()
    return render(tmp_path, version_line), version_line


def test_containerd_loads_the_nvidia_runtime_and_cdi_from_the_roles_config(
    containerd: Path, rendered: tuple[Path, str]
) -> None:
    config, version_line = rendered
    major = int(version_line.split()[2].lstrip("v").split(".")[0])
    assert tomllib.loads(config.read_text())["version"] == (3 if major >= 2 else 2)
    dumped = tomllib.loads(
        subprocess.check_output([containerd, "--config", str(config), "config", "dump"], text=True)
    )
    assert dumped["version"] == (3 if major >= 2 else 2)
    cri, sandbox = cri_sections(dumped)
    assert sandbox == SANDBOX
    assert cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    runtimes = cri["containerd"]
    assert runtimes["default_runtime_name"] == "nvidia"
    nvidia = runtimes["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert nvidia["options"]["SystemdCgroup"] is True
    assert runtimes["runtimes"]["runc"]["options"]["SystemdCgroup"] is True


@contextlib.contextmanager
def running(containerd: Path, config: Path, scratch: Path) -> Iterator[tuple[Path, Path]]:
    """containerd started with config, its root, state and sockets under scratch."""
    socket = scratch / "containerd.sock"
    live = scratch / "live.toml"
    text = config.read_text()
    own = (
        f'root = "{scratch}/root"\nstate = "{scratch}/state"\n'
        f'[grpc]\n  address = "{socket}"\n[ttrpc]\n  address = "{scratch}/ttrpc.sock"\n'
    )
    # Top-level keys go before the first table.
    head, table, rest = text.partition("\n[")
    live.write_text(f"{head}\n{own}\n{table}{rest}")
    log = scratch / "containerd.log"
    with log.open("w") as out:
        daemon = subprocess.Popen(
            [containerd, "--config", str(live)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not socket.exists() and time.monotonic() < deadline and daemon.poll() is None:
            time.sleep(0.5)
        assert socket.exists(), log.read_text()[-3000:]
        yield socket, log
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting containerd needs root")
def test_containerd_starts_its_cri_plugins_with_the_roles_config(
    containerd: Path, rendered: tuple[Path, str], tmp_path: Path
) -> None:
    config, _ = rendered
    scratch = Path(f"/tmp/gct-containerd-{os.getpid()}")
    scratch.mkdir()
    try:
        with running(containerd, config, scratch) as (socket, log):
            ctr = containerd.parent / "ctr"
            listing = subprocess.check_output(
                [ctr, "--address", str(socket), "plugins", "ls"], text=True
            )
            plugins = {tuple(line.split()[:2]): line.split()[-1] for line in listing.splitlines()}
            assert plugins[("io.containerd.grpc.v1", "cri")] == "ok", listing
            if ("io.containerd.cri.v1", "runtime") in plugins:
                assert plugins[("io.containerd.cri.v1", "runtime")] == "ok", listing
                assert plugins[("io.containerd.cri.v1", "images")] == "ok", listing
            assert "Configuration migrated" not in log.read_text()
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
