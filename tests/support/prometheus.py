"""A real Prometheus server for tests and benchmarks, preloaded with historical data.

``PrometheusServer(openmetrics_text)`` backfills the text into a fresh TSDB in a temporary
folder with ``promtool tsdb create-blocks-from openmetrics``, then runs ``prometheus`` on
127.0.0.1 with a free port and no scrape jobs. ``start``/``stop`` may be called repeatedly:
a restart keeps the port and the data (the daemon's reliability tests rely on this). Used as
a context manager it starts on entry and stops and deletes its folder on exit.

Missing ``prometheus``/``promtool`` binaries make ``start`` skip the calling test with the
reason. Build the text with ``tests.support.dcgm`` (see ``standard_dataset``).

``StandInPrometheus`` is a test double for the HTTP API (errors, time-outs, odd answers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.dcgm import Dataset
from tests.support.ports import free_port

PROMETHEUS_BINARY = "prometheus"
PROMTOOL_BINARY = "promtool"
READY_TIMEOUT_SECONDS = 30.0
CONFIG = "global:\n  scrape_interval: 1m\n  evaluation_interval: 1m\n"


def missing_binaries() -> list[str]:
    """The Prometheus binaries not on PATH (Debian package ``prometheus`` provides both)."""
    return [name for name in (PROMETHEUS_BINARY, PROMTOOL_BINARY) if shutil.which(name) is None]


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

    def requests_served(self, handler: str = "/api/v1/query_range") -> int:
        """How many requests Prometheus itself counted for an API handler (any status code)."""
        text = requests.get(f"{self.url}/metrics", timeout=5).text
        return round(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "prometheus_http_requests_total"
                and sample.labels.get("handler") == handler
            )
        )

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


Reply = tuple[int, str | bytes]  # HTTP status, body (str bodies are sent as JSON)
Responder = Callable[[dict[str, str]], Reply]


def matrix_reply(result: list[dict[str, object]]) -> Reply:
    """A successful query_range answer with ``result`` as its series."""
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return 200, json.dumps(body)


def error_reply(status: int, message: str, kind: str = "bad_data") -> Reply:
    """An error answer shaped like Prometheus' own."""
    return status, json.dumps({"status": "error", "errorType": kind, "error": message})


class StandInPrometheus:
    """Test double for Prometheus' HTTP API where a real server cannot misbehave on demand.

    ``responder`` gets the request's query parameters and returns (status, body); it may sleep
    to provoke time-outs. Every request's parameters, client port and headers are recorded in
    ``requests``, ``client_ports`` (equal ports mean the connection was reused) and ``headers``.
    """

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[dict[str, str]] = []
        self.client_ports: list[int] = []
        self.headers: list[dict[str, str]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus does

            def do_GET(self) -> None:
                params = {
                    key: values[-1] for key, values in parse_qs(urlsplit(self.path).query).items()
                }
                stand_in.requests.append(params)
                stand_in.client_ports.append(self.client_address[1])
                stand_in.headers.append(dict(self.headers.items()))
                status, body = stand_in.responder(params)
                payload = body.encode() if isinstance(body, str) else body
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a time-out test)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> StandInPrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
