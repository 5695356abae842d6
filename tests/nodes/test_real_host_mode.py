"""The node checks in checks/ run unchanged against hosts named with testinfra's --hosts.

The provisioned test nodes stand in for real GPU servers here: a separate pytest run gets them as
plain `ssh://` hosts, exactly as it would get real servers, and boots nothing itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nodes.harness.provision import WORKERS, Provisioned

pytestmark = [pytest.mark.nodes, pytest.mark.slow]
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_checks_run_against_hosts_given_on_the_command_line(provisioned: Provisioned) -> None:
    cluster = provisioned.cluster
    hosts = ",".join(f"ssh://root@{node.address}" for node in cluster.nodes)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/nodes/checks",
            f"--hosts={hosts}",
            f"--ssh-identity-file={cluster.ssh_key}",
            f"--ssh-extra-args=-o UserKnownHostsFile={cluster.known_hosts}"
            " -o StrictHostKeyChecking=yes",
            f"--node-image={provisioned.image}",
            "-p",
            "no:cacheprovider",
            "-v",
            "-rs",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    # Every check ran once per given host, identified by its ssh:// address, not a test node name.
    for node in cluster.nodes:
        assert re.search(rf"\[ssh://{re.escape(node.address)}\] PASSED", output), output[-3000:]
    assert "gpu-cp-1]" not in output
    # Without --real-gpu the GPU checks are skipped with their reason; one worker init check too.
    assert output.count("run against GPU hosts with --real-gpu") >= 1
    summary = re.search(r"(\d+) passed, (\d+) skipped", output)
    assert summary is not None, output[-2000:]
    # Four `gpu` checks per host, the MIG layout check per host (no layout applied: test_mig.py
    # removes its own), plus the control-plane config check on each worker.
    assert int(summary[2]) == 5 * len(cluster.nodes) + len(WORKERS)
    assert "no MIG layout configured on this host" in output
