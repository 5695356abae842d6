"""Session fixtures: boot Debian test nodes once, provision them once, share them with every test.

Nothing is booted unless a test asks for `cluster` (directly or through `provisioned`), so the
node checks in checks/ can also run against real hosts (`--hosts=ssh://gpu1`) on any machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nodes.harness.cluster import (
    DEFAULT_NODE_NAMES,
    Cluster,
    missing_requirements,
    running_cluster,
)
from tests.nodes.harness.provision import Provisioned, provision


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two booted Debian 12 nodes plus the apt proxy and the stand-in repositories."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with running_cluster(tmp_path_factory.mktemp("nodes"), DEFAULT_NODE_NAMES) as booted:
        yield booted


@pytest.fixture(scope="session")
def provisioned(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Provisioned:
    """The playbook runs, done once: check mode, a run that fails half-way, converge, rerun."""
    return provision(cluster, tmp_path_factory.mktemp("ansible"))
