"""Fixtures shared by the unit tests.

``connection``: the profiler's Kubernetes client connected to the stand-in API server through a
kubeconfig; a test module provides its own ``apiserver`` fixture (the nodes and pods it needs).
``cli_environment``: the CLI's settings cleared from the environment and its signal handlers
restored afterwards, for tests that run ``main`` in-process.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_app.kube import KubeConnection, connect
from tests.support.apiserver.server import StandInApiServer
from tests.support.clock import FakeClock
from tests.support.environment import is_cli_setting


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


@pytest.fixture
def cli_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [name for name in os.environ if is_cli_setting(name)]:
        monkeypatch.delenv(name)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
