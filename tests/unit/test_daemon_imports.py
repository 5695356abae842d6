"""``gpu-profiler run`` loads what its mode uses: the DaemonSet leaves local mode's libraries out.

Each mode is built in a fresh interpreter (``commands.run._build``, as ``handle`` does) and its
``sys.modules`` inspected. DaemonSet mode: a Prometheus URL (nothing is queried while building),
a SQLite store in tmp_path and the stand-in Kubernetes API server (test double:
tests/support/apiserver/) through a kubeconfig. Local mode is the control: the same check sees
the libraries there, so it can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiserver.server import StandInApiServer, running_apiserver

ROOT = Path(__file__).resolve().parents[2]
# Local mode's: the terminal table (rich), NVML and host sampling (psutil).
LOCAL_ONLY = ("rich", "pynvml", "psutil")
# Loaded in DaemonSet mode: proof that the whole mode was built, not an early exit.
DAEMONSET_PARTS = (
    "kubernetes",
    "sqlite3",
    "profiler_app.sinks.kubernetes",
    "profiler_app.sinks.store",
)
# The store's migration and report libraries: the daemon writes through the DB-API driver.
STORE_TOOLS = ("sqlalchemy", "alembic")

BUILD = """
import contextlib, json, sys
from profiler_app.cli import build_parser
from profiler_app.commands import run
config = run.RunConfig.from_args(build_parser("run").parse_args(sys.argv[1:]))
with contextlib.ExitStack() as resources:
    daemon = run._build(config, resources)
    loaded = sorted(n for n in sys.modules if "." not in n or n.startswith("profiler_app"))
    assert daemon.close()
print(json.dumps(loaded))
"""


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        yield server


def modules_of_run(*argv: str) -> set[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPU_PROFILER_")}
    environment.pop("KUBERNETES_SERVICE_HOST", None)
    environment.pop("KUBECONFIG", None)
    completed = subprocess.run(
        [sys.executable, "-c", BUILD, "run", "--node", "gpu-node-1", "--metrics-port", "0", *argv],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return set(json.loads(completed.stdout.splitlines()[-1]))


def test_the_daemonset_mode_leaves_local_mode_libraries_out(
    apiserver: StandInApiServer, tmp_path: Path
) -> None:
    loaded = modules_of_run(
        "--prometheus-url",
        "http://127.0.0.1:9",
        "--kubeconfig",
        str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        "--store-url",
        f"sqlite:///{tmp_path / 'profiler.db'}",
    )
    assert set(DAEMONSET_PARTS) <= loaded
    assert loaded & set(LOCAL_ONLY) == set()
    assert loaded & set(STORE_TOOLS) == set()
    assert not {"profiler_app.sinks.terminal", "profiler_app.sources.nvml"} & loaded


def test_local_mode_loads_them(tmp_path: Path) -> None:
    loaded = modules_of_run("--store-url", "none", "--cgroup-root", str(tmp_path))
    assert set(LOCAL_ONLY) <= loaded
    assert "kubernetes" not in loaded
