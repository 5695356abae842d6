"""A GPU node that already lists NVIDIA's CUDA repository, as NVIDIA's cuda-keyring package does.

cuda-keyring (a .deb on NVIDIA's CUDA repository, not on GitHub) installs
/etc/apt/sources.list.d/cuda-<distro>-<arch>.list with one line,
`deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] <repository>/ /`, and that keyring;
scripts that check what the package installed quote exactly these names (found with the code
search: e.g. a verification script asserting that line for cuda-ubuntu2404-x86_64.list). Here the
same file points at the stand-in CUDA repository, and the keyring holds the stand-in's key.

A second source of one URI with another Signed-By makes every apt command fail. The roles find
the existing source and reuse it (the default) or replace it, saying which; a rerun changes
nothing and apt works throughout.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.nodes.harness import standin_repo
from tests.nodes.harness.ansible_run import RunResult, run_playbook
from tests.nodes.harness.machine import Node
from tests.nodes.harness.provision import Provisioned

pytestmark = pytest.mark.nodes

NODE = "gpu-worker-1"  # Ubuntu 22.04: NVIDIA's CUDA repository ubuntu2204
CUDA_LIST = "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"
CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
OWN_SOURCE = "/etc/apt/sources.list.d/nvidia-cuda.sources"
CONFLICT = "Conflicting values set for option Signed-By"


def _apt_update(node: Node) -> subprocess.CompletedProcess[str]:
    return node.run("apt-get update 2>&1", check=False)


def _run(provisioned: Provisioned, *extra: str) -> RunResult:
    return run_playbook(
        "gpu_nodes.yml", provisioned.inventory, "--limit", NODE, *extra, timeout=1200
    )


@pytest.fixture(scope="module")
def keyring_host(provisioned: Provisioned) -> Iterator[tuple[Node, str]]:
    """The node with cuda-keyring's source and key added next to the role's own source; put back
    afterwards (the role's own source again, no cuda-keyring files)."""
    node = provisioned.cluster.node(NODE)
    url = provisioned.cluster.host_vars(node)["nvidia_driver_ubuntu_repo_url"]
    armored = (
        provisioned.cluster.workdir
        / "www"
        / standin_repo.cuda_repo(node.system)
        / standin_repo.CUDA_KEY_NAME
    )
    keyring = subprocess.run(
        ["gpg", "--dearmor"], input=armored.read_bytes(), capture_output=True, check=True
    ).stdout
    (node.root / CUDA_KEYRING.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (node.root / CUDA_KEYRING.lstrip("/")).write_bytes(keyring)
    (node.root / CUDA_LIST.lstrip("/")).write_text(f"deb [signed-by={CUDA_KEYRING}] {url} /\n")
    try:
        yield node, url
    finally:
        node.run(f"rm -f {CUDA_LIST} {CUDA_LIST}.disabled {CUDA_KEYRING}")
        if node.run(f"test -f {OWN_SOURCE}", check=False).returncode != 0:
            restored = _run(provisioned)
            assert restored.returncode == 0, restored.describe()
        assert CONFLICT not in _apt_update(node).stdout


def test_the_keyring_source_next_to_the_roles_own_breaks_apt(
    keyring_host: tuple[Node, str],
) -> None:
    """What the roles used to leave: both sources, and apt refusing to run."""
    node, _ = keyring_host
    assert node.run(f"test -f {OWN_SOURCE}", check=False).returncode == 0
    update = _apt_update(node)
    assert update.returncode != 0
    assert CONFLICT in update.stdout


def test_the_existing_source_is_reused_and_apt_works(
    keyring_host: tuple[Node, str], provisioned: Provisioned
) -> None:
    node, url = keyring_host
    run = _run(provisioned)
    assert run.returncode == 0, run.describe()
    assert (
        f"NVIDIA's CUDA repository ({url}) is already listed in {CUDA_LIST}: reusing it, "
        f"not adding {OWN_SOURCE}" in " ".join(run.output.split())
    )
    assert node.run(f"test -f {OWN_SOURCE}", check=False).returncode != 0
    assert node.read(CUDA_LIST) == f"deb [signed-by={CUDA_KEYRING}] {url} /\n"
    update = _apt_update(node)
    assert update.returncode == 0, update.stdout
    # The driver still comes from that repository, at the CUDA pin's priority.
    policy = node.run("apt-cache policy nvidia-utils-580").stdout
    assert f"600 {url.rstrip('/')}" in policy
    rerun = _run(provisioned)
    assert rerun.returncode == 0, rerun.describe()
    assert rerun.recap[NODE]["changed"] == 0, rerun.describe()


def test_the_existing_source_can_be_replaced_instead(
    keyring_host: tuple[Node, str], provisioned: Provisioned
) -> None:
    node, url = keyring_host
    replace = ("-e", "apt_prerequisites_existing_sources=replace")
    run = _run(provisioned, *replace)
    assert run.returncode == 0, run.describe()
    assert f"replacing it with {OWN_SOURCE}" in " ".join(run.output.split())
    assert node.read(CUDA_LIST) == (
        f"# replaced by {OWN_SOURCE}: deb [signed-by={CUDA_KEYRING}] {url} /\n"
    )
    assert url in node.read(OWN_SOURCE)
    update = _apt_update(node)
    assert update.returncode == 0, update.stdout
    rerun = _run(provisioned, *replace)
    assert rerun.returncode == 0, rerun.describe()
    assert rerun.recap[NODE]["changed"] == 0, rerun.describe()


def test_nothing_is_found_where_no_other_source_names_the_repository(
    provisioned: Provisioned,
) -> None:
    """The session's nodes list each vendor repository once: the search finds nothing there."""
    assert "is already listed in" not in provisioned.rerun.output
    assert "Say what is done with the existing sources of NVIDIA's CUDA repository" in (
        provisioned.rerun.output
    )
