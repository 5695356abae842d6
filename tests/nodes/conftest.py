"""Session fixtures: boot Debian test nodes once, provision them once, share them with every test.

Nothing is booted unless a test asks for `cluster` (directly or through `provisioned`), so the
node checks in checks/ can also run against real hosts (`--hosts=ssh://gpu1`) on any machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nodes.harness.cluster import Cluster, missing_requirements, running_cluster

NODE_NAMES = ["gpu-cp-1", "gpu-worker-1"]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two booted Debian 12 nodes plus the apt proxy and the stand-in repositories."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with running_cluster(tmp_path_factory.mktemp("nodes"), NODE_NAMES) as booted:
        yield booted
