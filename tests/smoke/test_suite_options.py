"""How the smoke suite starts: skipped without a kubeconfig, one clear line for a bad one, and
the node checks of tests/nodes/checks in the same run when hosts are given.

Runs pytest as users do, in a subprocess. ``--collect-only`` shows what a run would execute
without reaching a cluster or a host; the node checks themselves are verified against booted
test nodes in tests/nodes/test_real_host_mode.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = "--hosts=ssh://root@gpu-a,ssh://root@gpu-b"


def pytest_run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def collected(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_without_a_kubeconfig_every_check_is_skipped_with_the_reason() -> None:
    result = pytest_run("tests/smoke/checks", "-q", "-rs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^24 skipped in ", result.stdout, re.MULTILINE), result.stdout
    assert result.stdout.count("no --kubeconfig given: the smoke suite checks a real cluster") >= 1


def test_an_unusable_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    result = pytest_run("tests/smoke/checks", f"--kubeconfig={missing}", "-q")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"smoke suite: cannot use kubeconfig {missing}" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_hosts_bring_the_node_checks_into_the_same_run() -> None:
    result = pytest_run("tests/smoke/checks", "--kubeconfig=k", HOSTS, "--collect-only", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    items = collected(result)
    smoke = [item for item in items if item.startswith("tests/smoke/checks/")]
    nodes = [item for item in items if item.startswith("tests/nodes/checks/")]
    assert len(smoke) == 24
    checks = {item.split("[")[0] for item in nodes}
    assert len(checks) > 10
    for host in ("ssh://gpu-a", "ssh://gpu-b"):  # testinfra's ids leave the user out
        on_host = [item for item in nodes if re.search(rf"[\[-]{host}[\]-]", item)]
        assert {item.split("[")[0] for item in on_host} == checks
        assert len(on_host) == len(nodes) / 2
    assert len(items) == len(smoke) + len(nodes)


def test_node_checks_named_on_the_command_line_run_once() -> None:
    both = pytest_run(
        "tests/smoke/checks", "tests/nodes/checks", "--kubeconfig=k", HOSTS, "--collect-only", "-q"
    )
    alone = pytest_run("tests/smoke/checks", "--kubeconfig=k", HOSTS, "--collect-only", "-q")
    assert collected(both) == collected(alone), both.stdout


def test_without_hosts_no_node_check_joins() -> None:
    result = pytest_run("tests/smoke/checks", "--kubeconfig=k", "--collect-only", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert collected(result)
    assert all(item.startswith("tests/smoke/checks/") for item in collected(result))
