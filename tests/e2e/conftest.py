"""Runs ``gpu-profiler run`` as a real subprocess and reads its /metrics and /healthz."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class DaemonProcess:
    """``python -m profiler_app run ARGS`` with a clean environment and its own metrics port."""

    def __init__(self, args: list[str], tmp_path: Path, *, metrics: bool = True) -> None:
        self.port = free_port() if metrics else 0
        environment = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("GPU_PROFILER_")
            and name not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "NODE_NAME"}
        }
        environment["XDG_DATA_HOME"] = str(tmp_path / "data")
        self.log_path = tmp_path / f"run-{self.port}.log"
        command = [sys.executable, "-m", "profiler_app", "run", "--metrics-port", str(self.port)]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*command, *args], cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT
            )
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def samples(self) -> Samples:
        try:
            text = requests.get(f"{self.base}/metrics", timeout=2).text
        except requests.RequestException:
            return {}
        # A label with an empty value is no label to Prometheus (GPU_I_ID on a whole GPU).
        return {
            (sample.name, frozenset((k, v) for k, v in sample.labels.items() if v)): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, frozenset(labels.items())))

    def errors(self, kind: str) -> float:
        return self.value("gpu_profiler_errors_total", kind=kind) or 0.0

    def healthz(self) -> int:
        return requests.get(f"{self.base}/healthz", timeout=2).status_code

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                pytest.fail(f"gpu-profiler run exited ({self.process.returncode}):\n{self.log()}")
            if condition():
                return
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}; log:\n{self.log()[-4000:]}")

    def terminate(self) -> tuple[int, float]:
        """Sends SIGTERM; returns the exit status and how long the exit took."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"no exit 15 s after SIGTERM; log:\n{self.log()[-4000:]}")
        return status, time.monotonic() - started

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
            self.process.wait()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts ``gpu-profiler run`` processes; any still running at the end is killed."""
    started: list[DaemonProcess] = []

    def start(*args: str, metrics: bool = True) -> DaemonProcess:
        process = DaemonProcess(list(args), tmp_path, metrics=metrics)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        yield server
