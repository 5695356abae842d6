"""Session fixtures: boot Debian test nodes once, provision them once, share them with every test.

Nothing is booted unless a test asks for `cluster` (directly or through `provisioned`), so the
node checks in checks/ can also run against real hosts (`--hosts=ssh://gpu1`) on any machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodes.harness.cluster import (
    DEFAULT_NODES,
    Cluster,
    missing_requirements,
    running_cluster,
)
from tests.nodes.harness.provision import Provisioned, provision

HERE = Path(__file__).resolve().parent
# The first test to ask for `provisioned` pays for booting and provisioning: on a cold cache that is
# debootstrap plus every .deb downloaded, well past the suite's default per-test timeout.
FIRST_TEST_TIMEOUT_S = 1800


# Tests that take the session's cluster down (reset.yml), in this order, after every other test:
# the upgrade builds it again at an older version and upgrades it, the reset ends it.
LAST = (HERE / "test_upgrade.py", HERE / "test_reset.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.timeout(FIRST_TEST_TIMEOUT_S))
    last = sorted(
        (item for item in items if Path(str(item.path)).resolve() in LAST),
        key=lambda item: LAST.index(Path(str(item.path)).resolve()),
    )
    items[:] = [item for item in items if item not in last] + last


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three booted nodes (Debian 12, Ubuntu 22.04, Ubuntu 24.04) plus the apt proxy and the
    stand-in repositories."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with running_cluster(
        tmp_path_factory.mktemp("nodes"), list(DEFAULT_NODES), DEFAULT_NODES
    ) as booted:
        yield booted


@pytest.fixture(scope="session")
def provisioned(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Provisioned:
    """The playbook runs, done once: check mode, a run that fails half-way, one whose kubeadm init
    fails, converge, rerun."""
    return provision(cluster, tmp_path_factory.mktemp("ansible"))
