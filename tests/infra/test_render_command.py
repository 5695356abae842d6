"""``python -m infra.render``: what users run to see, check or commit what a stack installs.

Test doubles: Pulumi's mock engine stands in for the Pulumi CLI (the command's own design); the
chart cache is ../shared/charts; for ``--pull-charts`` a local HTTP chart repository (Python's
http.server, its index.yaml written by Helm's own `repo index`) stands in for the charts' public
repositories, which cannot be reached here.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from infra import versions
from infra.render import __main__ as command
from infra.render.charts import CHART_CACHE_ENV, chart_cache
from infra.render.program import FAKE_PASSWORD
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK, REPO_ROOT
from tests.support.ports import free_port

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(*args: str | Path) -> int:
    return command.main([str(a) for a in args])


def test_writes_every_object_into_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rendered"
    assert render(EKS_STACK, "--out", out) == 0
    files = sorted(p.relative_to(out) for p in out.rglob("*.yaml"))
    assert f"wrote {len(files)} objects to {out}" in capsys.readouterr().err
    names = {str(f) for f in files}
    assert {
        "helm/kube-prometheus-stack/monitoring/Deployment-kube-prometheus-stack-operator.yaml",
        "helm/kube-prometheus-stack/_cluster/"
        "CustomResourceDefinition-prometheuses.monitoring.coreos.com.yaml",
        "helm/dcgm-exporter/monitoring/DaemonSet-dcgm-exporter.yaml",
        "workload-autoscaling/_cluster/Namespace-inference.yaml",
        "workload-autoscaling/inference/ScaledObject-llm-server.yaml",
        "gpu-profiler/gpu-profiler/DaemonSet-gpu-profiler.yaml",
        "stack/_cluster/StorageClass-gp3-encrypted.yaml",
    } <= names
    operator = yaml.safe_load(
        (out / "gpu-profiler/gpu-profiler/DaemonSet-gpu-profiler.yaml").read_text()
    )
    assert list(operator)[:3] == ["apiVersion", "kind", "metadata"]
    # The program's Secrets are written without their values (a mock's placeholders here).
    secret = yaml.safe_load((out / "gpu-platform/monitoring/Secret-grafana-admin.yaml").read_text())
    assert set(secret["stringData"].values()) == {command.REDACTED}
    assert not [f for f in files if FAKE_PASSWORD in (out / f).read_text()]


def test_rewrites_its_own_folder_and_refuses_others(tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    assert render(KUBEADM_STACK, "--out", out) == 0
    stale = out / "gpu-platform" / "stale.yaml"
    stale.write_text("kind: Gone\n")
    assert render(KUBEADM_STACK, "--out", out) == 0
    assert not stale.exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert render(KUBEADM_STACK, "--out", foreign) == 2
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_yaml_stream_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert render(KUBEADM_STACK) == 0
    documents = list(yaml.load_all(capsys.readouterr().out, Loader=LOADER))
    kinds = {d["kind"] for d in documents}
    assert {"Namespace", "CustomResourceDefinition", "DaemonSet", "Prometheus", "Job"} <= kinds
    assert len(documents) > 150


def test_check_passes_on_the_example_stack_as_a_command() -> None:
    """The real entry point, in its own process, as a user runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "infra.render", "stacks/kubeadm", "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("all checks pass (")
    assert "on kubeadm, 9 checks)" in result.stdout
    assert "Traceback" not in result.stderr


def test_check_reports_findings_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load((EKS_STACK / "Pulumi.dev.yaml").read_text())
    del config["config"]["gpu-cluster-eks:exampleWorkload"]["createNamespace"]
    stack_file = tmp_path / "Pulumi.review.yaml"
    stack_file.write_text(yaml.safe_dump(config))
    assert render(EKS_STACK, "--config", stack_file, "--check") == 1
    out = capsys.readouterr().out.splitlines()
    assert {line.split(" (")[0] for line in out[:-1]} == {
        f"namespaces: {kind} inference/llm-server"
        for kind in ("Deployment", "Service", "PodMonitor", "ScaledObject")
    }
    assert out[-1].startswith("4 problems found (")
    args = ("--config", stack_file, "--check", "--assume-namespace", "inference")
    assert render(EKS_STACK, *args) == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"gpu-cluster-eks:exampleWorkload": {"replicas": 2}},
            "stack config exampleWorkload has unknown keys replicas",
        ),
        ({"gpu-cluster-eks:publicAccessCidrs": ["203.0.113.0/24"]}, "is a documentation range"),
        ({"gpu-cluster-eks:gpuMetricsIntervalSeconds": "fast"}, "gpuMetricsIntervalSeconds"),
        ({"gpu-cluster-eks:karpenter": {"gpuLimit": 0}}, "karpenter: gpuLimit must be at least 1"),
    ],
)
def test_bad_stack_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: dict[str, object], message: str
) -> None:
    stack_file = tmp_path / "Pulumi.bad.yaml"
    stack_file.write_text(yaml.safe_dump({"config": {"aws:region": "us-west-2", **config}}))
    assert render(EKS_STACK, "--config", stack_file) == 2
    err = capsys.readouterr().err
    assert err.startswith("render: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert render(tmp_path) == 2
    assert (
        capsys.readouterr().err
        == f"render: error: {tmp_path} is not a stack folder (no Pulumi.yaml)\n"
    )
    assert render(EKS_STACK, "--config", tmp_path / "missing.yaml") == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "list.yaml").write_text("- a\n")
    assert render(EKS_STACK, "--config", tmp_path / "list.yaml") == 2
    assert "must hold a YAML mapping" in capsys.readouterr().err


def test_encrypted_config_values_become_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stack file after `pulumi config set --secret` holds ciphertext, which stays unread."""
    config = yaml.safe_load((KUBEADM_STACK / "Pulumi.dev.yaml").read_text())
    secure = {"secure": "v1:Zm9vYmFy:ciphertext"}
    config["config"]["gpu-cluster-kubeadm:grafanaAdminPassword"] = secure
    config["config"]["gpu-cluster-kubeadm:profilerStoreUrl"] = secure
    config["config"]["gpu-cluster-kubeadm:profilerStore"] = "external"
    inventory = KUBEADM_STACK / config["config"]["gpu-cluster-kubeadm:inventory"]
    config["config"]["gpu-cluster-kubeadm:inventory"] = str(inventory)
    stack_file = tmp_path / "Pulumi.encrypted.yaml"
    stack_file.write_text(yaml.safe_dump(config))
    assert render(KUBEADM_STACK, "--config", stack_file) == 0
    documents = list(yaml.load_all(capsys.readouterr().out, Loader=LOADER))
    secrets = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Secret"}
    assert set(secrets["gpu-profiler-store"]["stringData"].values()) == {command.REDACTED}
    assert "ciphertext" not in json.dumps(documents)


def test_a_missing_chart_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CHART_CACHE_ENV, str(tmp_path))
    assert render(EKS_STACK) == 2
    assert capsys.readouterr().err == (
        f"render: error: chart nvidia-device-plugin 0.20.0 is not in the chart cache {tmp_path}: "
        "run `python -m infra.render --pull-charts` where the chart repositories are reachable, "
        f"or set {CHART_CACHE_ENV} to a folder holding nvidia-device-plugin-0.20.0.tgz\n"
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        type(self).requests.append(self.path)


@pytest.fixture
def chart_repository(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """The pinned charts served as a Helm repository on localhost; yields its URL and requests."""
    served = tmp_path / "repository"
    served.mkdir()
    for chart in versions.PINNED_CHARTS:
        name = f"{chart.name}-{chart.version}.tgz"
        shutil.copy(chart_cache() / name, served / name)
    port = free_port()
    helm.repo_index_generate(served, base_url=f"http://127.0.0.1:{port}")
    handler = type("Handler", (_QuietHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(handler, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", handler.requests
    finally:
        server.shutdown()
        server.server_close()


def test_pull_charts_fills_the_cache_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chart_repository: tuple[str, list[str]],
) -> None:
    url, requests = chart_repository
    pinned = tuple(
        versions.HelmChart(name=c.name, repo=url, version=c.version) for c in versions.PINNED_CHARTS
    )
    source = chart_cache()
    monkeypatch.setattr(versions, "PINNED_CHARTS", pinned)
    cache = tmp_path / "cache"
    monkeypatch.setenv(CHART_CACHE_ENV, str(cache))
    assert render("--pull-charts") == 0
    for chart in pinned:
        name = f"{chart.name}-{chart.version}.tgz"
        assert (cache / name).read_bytes() == (source / name).read_bytes()
    assert {r for r in requests if r.endswith(".tgz")} == {
        f"/{c.name}-{c.version}.tgz" for c in pinned
    }
    requests.clear()
    assert render("--pull-charts", KUBEADM_STACK, "--check") == 0
    assert requests == []  # everything was cached
