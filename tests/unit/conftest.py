"""Fixtures shared by the unit tests.

``connection``: the profiler's Kubernetes client connected to the stand-in API server through a
kubeconfig; a test module provides its own ``apiserver`` fixture (the nodes and pods it needs).
``cli_environment``: the CLI's settings cleared from the environment and its signal handlers
restored afterwards, for tests that run ``main`` in-process.
``sink``: a ``KubernetesSink`` for node-a over ``connection``, its heartbeat every 10 minutes of
``clock``.
``protector``: a ``TrainingProtector`` for node-a over ``connection``.
``store``: a ``TableStore`` on ``store_url`` (a module registers tests.support.postgres for it).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_app.core.kube import KubeConnection, connect
from profiler_app.sinks.kubernetes import KubernetesSink
from profiler_app.sinks.kubernetes.protection import TrainingProtector
from profiler_app.sinks.store import TableStore
from tests.support import annotated_node, protected_pods
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


@pytest.fixture
def sink(connection: KubeConnection, clock: FakeClock) -> KubernetesSink:
    return KubernetesSink(connection, annotated_node.NODE, heartbeat_seconds=600, clock=clock)


@pytest.fixture
def protector(connection: KubeConnection) -> TrainingProtector:
    return TrainingProtector(connection, protected_pods.NODE, domain=protected_pods.DOMAIN)


@pytest.fixture
def store(store_url: str) -> Iterator[TableStore]:
    sink = TableStore(store_url)
    yield sink
    sink.close()
