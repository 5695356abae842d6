"""Fixtures shared by the unit tests that talk to the stand-in API server.

A test module provides its own ``apiserver`` fixture (the nodes and pods it needs); ``connection``
connects the profiler's Kubernetes client to it through a kubeconfig.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_app.kube import KubeConnection, connect
from tests.support.apiserver import StandInApiServer
from tests.support.clock import FakeClock


@pytest.fixture
def connection(apiserver: StandInApiServer, tmp_path: Path) -> Iterator[KubeConnection]:
    made = connect(
        str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")), request_timeout=(1.0, 0.5)
    )
    assert made is not None
    yield made
    made.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
