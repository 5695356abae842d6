"""infra.unprotect_run: what `pulumi destroy` of GpuProfiler runs, against the stand-in Kubernetes
API server (a test double, see tests/support/apiserver/), as Pulumi's command would: a child
process with the kubeconfig's content in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import unprotect_run
from tests.infra.conftest import REPO_ROOT
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        marked = {DO_NOT_DISRUPT: "true", "ml.example.com/do-not-disrupt": "training"}
        server.add_pod(pod_manifest("ml", "trainer-0", "gpu-1", gpus=1, annotations=marked))
        server.add_pod(
            pod_manifest("ml", "pinned", "gpu-2", gpus=1, annotations={DO_NOT_DISRUPT: "true"})
        )
        yield server


def test_the_delete_step_releases_the_profilers_marks_everywhere(
    apiserver: StandInApiServer, tmp_path: Path
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig").read_text()
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST"}
    }
    environment |= {
        unprotect_run.ENV_KUBECONFIG: kubeconfig,
        unprotect_run.ENV_ANNOTATION_DOMAIN: "ml.example.com",
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "infra.unprotect_run"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert apiserver.pod("ml", "trainer-0")["metadata"]["annotations"] == {}
    assert apiserver.pod("ml", "pinned")["metadata"]["annotations"] == {DO_NOT_DISRUPT: "true"}
    assert "1 pod(s) carried the profiler's marker: 1 released, 0 failed" in done.stdout
    assert list(tmp_path.glob("gpu-profiler-unprotect-*")) == []  # the kubeconfig is gone
    assert apiserver.token not in done.stdout + done.stderr


def test_without_a_kubeconfig_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert unprotect_run.main([], environ={}) == 2
    assert capsys.readouterr().err == (
        "error: GPU_CLUSTER_KUBECONFIG must hold the cluster's kubeconfig\n"
    )
