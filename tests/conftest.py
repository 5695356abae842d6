"""Fixtures shared by every test folder. Logic lives in tests/support; keep this file small."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.dcgm import Dataset, standard_dataset
from tests.support.prometheus import LoadedPrometheus, PrometheusServer


@pytest.fixture(scope="session")
def prometheus_dataset() -> Dataset:
    """3 nodes (gpu-node-1..3) x 4 GPUs, 6 h at 10 s ending now, job types in ``.expected``."""
    return standard_dataset()


@pytest.fixture(scope="session")
def prometheus(prometheus_dataset: Dataset) -> Iterator[LoadedPrometheus]:
    """A real Prometheus on 127.0.0.1 serving ``prometheus_dataset`` (skips without the binaries).

    Shared by the whole session: do not stop it; start your own ``PrometheusServer`` to do that.
    """
    with PrometheusServer(prometheus_dataset.openmetrics) as server:
        yield LoadedPrometheus(server, prometheus_dataset)
