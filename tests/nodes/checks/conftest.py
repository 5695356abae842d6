"""Which hosts the node checks run against.

Default: the booted Debian test nodes, provisioned once per session by tests/nodes/conftest.py.
With testinfra's `--hosts` (e.g. `--hosts=ssh://gpu1,ssh://gpu2`, plus `--ssh-config`,
`--ssh-identity-file`, `--sudo` as usual): those hosts, and nothing is booted. `--real-gpu` adds
the checks that need a real driver and GPU; `--node-image` names a local image for `docker run`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import testinfra
import yaml
from testinfra.host import Host

from tests.nodes.harness.ansible_run import PLAYBOOKS
from tests.nodes.harness.cluster import DEFAULT_NODE_NAMES
from tests.nodes.harness.provision import CONTROL_PLANE, Provisioned


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("node checks")
    group.addoption(
        "--real-gpu",
        action="store_true",
        default=False,
        help="also run the checks that need a real NVIDIA driver and GPU (nvidia-smi -L)",
    )
    group.addoption(
        "--node-image",
        default=None,
        help="local Docker image for the `docker run` check on real hosts (default: skip it)",
    )
    group.addoption(
        "--kubernetes-version",
        default=None,
        help="expected Kubernetes version (default: kubernetes_node_version of the role defaults)",
    )


def _real_hosts(config: pytest.Config) -> list[str]:
    hosts = config.getoption("hosts", default=None)
    return str(hosts).split(",") if hosts else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node" not in metafunc.fixturenames:
        return
    specs = _real_hosts(metafunc.config)
    if not specs:
        metafunc.parametrize("node_target", DEFAULT_NODE_NAMES, indirect=True, scope="session")
        return
    option = metafunc.config.getoption
    # Expands patterns such as ansible://gpu_nodes, like testinfra's own `host` fixture does.
    hosts = testinfra.get_hosts(
        specs,
        connection=option("connection", default=None),
        ssh_config=option("ssh_config", default=None),
        ssh_identity_file=option("ssh_identity_file", default=None),
        ssh_extra_args=option("ssh_extra_args", default=None),
        sudo=option("sudo", default=False),
        sudo_user=option("sudo_user", default=None),
        ansible_inventory=option("ansible_inventory", default=None),
        force_ansible=option("force_ansible", default=False),
    )
    metafunc.parametrize(
        "node_target",
        hosts,
        ids=[host.backend.get_pytest_id() for host in hosts],
        indirect=True,
        scope="session",
    )


@pytest.fixture(scope="session")
def node_target(request: pytest.FixtureRequest) -> str | Host:
    """A test node's name, or a real host given with --hosts."""
    target: str | Host = request.param
    return target


@pytest.fixture(scope="session")
def on_test_nodes(request: pytest.FixtureRequest) -> bool:
    return not _real_hosts(request.config)


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest, node_target: str | Host, on_test_nodes: bool) -> Host:
    """A testinfra host: a provisioned test node, or a real host from --hosts."""
    if not isinstance(node_target, str):
        return node_target
    provisioned: Provisioned = request.getfixturevalue("provisioned")
    cluster = provisioned.cluster
    booted = cluster.node(node_target)
    return testinfra.get_host(
        f"ssh://root@{booted.address}",
        ssh_identity_file=str(cluster.ssh_key),
        ssh_extra_args=f"-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes",
    )


@pytest.fixture(scope="session")
def is_control_plane(node: Host, node_target: str | Host) -> bool:
    if isinstance(node_target, str):
        return node_target in CONTROL_PLANE
    # On real hosts: only a control plane has the admin kubeconfig kubeadm init writes.
    return bool(node.file("/etc/kubernetes/admin.conf").exists)


@pytest.fixture(scope="session")
def kubernetes_version(request: pytest.FixtureRequest) -> str:
    wanted = request.config.getoption("kubernetes_version", default=None)
    if wanted:
        return str(wanted)
    defaults = PLAYBOOKS / "roles/kubernetes_node/defaults/main.yml"
    return str(yaml.safe_load(Path(defaults).read_text())["kubernetes_node_version"])


@pytest.fixture(scope="session")
def docker_image(request: pytest.FixtureRequest, on_test_nodes: bool) -> str:
    if on_test_nodes:
        provisioned: Provisioned = request.getfixturevalue("provisioned")
        return provisioned.image
    image = request.config.getoption("node_image", default=None)
    if not image:
        pytest.skip(
            "give --node-image=IMAGE (present on the hosts) to run containers on real hosts"
        )
    return str(image)


@pytest.fixture(scope="session")
def real_gpu(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("real_gpu", default=False):
        pytest.skip("needs a real NVIDIA GPU and driver: run against GPU hosts with --real-gpu")
