"""A real Prometheus server for tests and benchmarks, preloaded with historical data.

``PrometheusServer(openmetrics_text)`` backfills the text into a fresh TSDB in a temporary
folder with ``promtool tsdb create-blocks-from openmetrics``, then runs ``prometheus`` on
127.0.0.1 with a free port and no scrape jobs. ``start``/``stop`` may be called repeatedly:
a restart keeps the port and the data (the daemon's reliability tests rely on this). Used as
a context manager it starts on entry and stops and deletes its folder on exit.

Missing ``prometheus``/``promtool`` binaries make ``start`` skip the calling test with the
reason. Build the text with ``tests.support.dcgm`` (see ``standard_dataset``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import pytest
import requests

from tests.support.dcgm import Dataset

PROMETHEUS_BINARY = "prometheus"
PROMTOOL_BINARY = "promtool"
READY_TIMEOUT_SECONDS = 30.0
CONFIG = "global:\n  scrape_interval: 1m\n  evaluation_interval: 1m\n"


def missing_binaries() -> list[str]:
    """The Prometheus binaries not on PATH (Debian package ``prometheus`` provides both)."""
    return [name for name in (PROMETHEUS_BINARY, PROMTOOL_BINARY) if shutil.which(name) is None]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PrometheusServer:
    """One Prometheus process over a temporary TSDB; see the module docstring."""

    def __init__(self, openmetrics: str | None = None, port: int | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="prometheus-test-"))
        self.data = self.directory / "data"
        self.data.mkdir()
        self.config = self.directory / "prometheus.yml"
        self.config.write_text(CONFIG)
        self.log = self.directory / "prometheus.log"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = openmetrics

    def backfill(self, openmetrics: str) -> None:
        """Write ``openmetrics`` into the TSDB; only while stopped (blocks load at start)."""
        if self.running:
            raise RuntimeError("backfill a stopped server: Prometheus loads blocks when it starts")
        self._skip_without_binaries()
        source = self.directory / "backfill.om"
        source.write_text(openmetrics)
        completed = subprocess.run(
            [
                PROMTOOL_BINARY,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(source),
                str(self.data),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        source.unlink()
        if completed.returncode != 0:
            raise RuntimeError(f"promtool backfill failed: {completed.stderr.strip()[-2000:]}")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        if self._pending is not None:
            self.backfill(self._pending)
            self._pending = None
        self._skip_without_binaries()
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    PROMETHEUS_BINARY,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.data}",
                    "--storage.tsdb.retention.time=3650d",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def close(self) -> None:
        """Stop and delete the data."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PrometheusServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _skip_without_binaries(self) -> None:
        missing = missing_binaries()
        if missing:
            pytest.skip(f"{' and '.join(missing)} not installed (Debian package 'prometheus')")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self._log_tail()}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            f"prometheus not ready after {READY_TIMEOUT_SECONDS:g}s: {self._log_tail()}"
        )

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else "(no log)"


class LoadedPrometheus:
    """What the ``prometheus`` fixture yields: a running server and the dataset it holds."""

    def __init__(self, server: PrometheusServer, dataset: Dataset) -> None:
        self.server = server
        self.dataset = dataset

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def expected(self) -> dict[tuple[str, str], tuple[str, float | None]]:
        """(hostname, gpu index) -> (job type, training period in seconds or None)."""
        return self.dataset.expected
