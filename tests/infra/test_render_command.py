"""``python -m infra.render``: what users run to see, check or commit what a stack installs.

Test doubles: Pulumi's mock engine stands in for the Pulumi CLI (the command's own design); the
chart cache is ``$GPU_CLUSTER_CHART_CACHE``; for ``--pull-charts`` a local HTTP chart repository
(Python's http.server, its index.yaml written by Helm's own `repo index`) stands in for the charts'
public repositories, which a test does not reach.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from infra import versions
from infra.render import __main__ as command
from infra.render.charts import CHART_CACHE_ENV, UNPINNED_ENV, chart_cache, file_sha256
from infra.render.program import FAKE_PASSWORD
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK, REPO_ROOT
from tests.support.ports import free_port

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(*args: str | Path) -> int:
    return command.main([str(a) for a in args])


@pytest.mark.charts
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


@pytest.mark.charts
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


@pytest.mark.charts
def test_yaml_stream_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert render(KUBEADM_STACK) == 0
    documents = list(yaml.load_all(capsys.readouterr().out, Loader=LOADER))
    kinds = {d["kind"] for d in documents}
    assert {"Namespace", "CustomResourceDefinition", "DaemonSet", "Prometheus", "Job"} <= kinds
    assert len(documents) > 150


@pytest.mark.charts
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
    assert "on kubeadm, 10 checks)" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.charts
def test_check_reports_findings_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = yaml.safe_load((EKS_STACK / "Pulumi.example.yaml").read_text())
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
    base = {"aws:region": "us-west-2", "gpu-cluster-eks:karpenter": {"gpuLimit": 8}}
    stack_file.write_text(yaml.safe_dump({"config": {**base, **config}}))
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


@pytest.mark.charts
def test_encrypted_config_values_become_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stack file after `pulumi config set --secret` holds ciphertext, which stays unread."""
    config = yaml.safe_load((KUBEADM_STACK / "Pulumi.example.yaml").read_text())
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


def served_charts() -> tuple[versions.HelmChart, ...]:
    """The pinned charts of a Helm repository (OCI's too, served the same way) that the chart
    cache holds."""
    return tuple(c for c in versions.PINNED_CHARTS if (chart_cache() / c.archive).is_file())


@pytest.fixture
def chart_repository(tmp_path: Path) -> Iterator[tuple[str, list[str], Path]]:
    """The cached pinned charts served as a Helm repository on localhost; yields its URL, the
    requests it answered and the folder it serves."""
    served = tmp_path / "repository"
    served.mkdir()
    for chart in served_charts():
        shutil.copy(chart_cache() / chart.archive, served / chart.archive)
    port = free_port()
    helm.repo_index_generate(served, base_url=f"http://127.0.0.1:{port}")
    handler = type("Handler", (_QuietHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", port), functools.partial(handler, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", handler.requests, served
    finally:
        server.shutdown()
        server.server_close()


def _from(url: str) -> tuple[versions.HelmChart, ...]:
    """The served charts in the local repository, each pinned to the archive served there."""
    return tuple(
        dataclasses.replace(
            c, repo=url, sha256=file_sha256(chart_cache() / c.archive), digest_unknown=""
        )
        for c in served_charts()
    )


@pytest.mark.charts
def test_pull_charts_fills_the_cache_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chart_repository: tuple[str, list[str], Path],
) -> None:
    url, requests, _ = chart_repository
    pinned, served = _from(url), served_charts()
    source = chart_cache()
    cache = tmp_path / "cache"
    monkeypatch.setattr(versions, "PINNED_CHARTS", pinned)
    monkeypatch.setenv(CHART_CACHE_ENV, str(cache))
    assert render("--pull-charts") == 0
    for chart in pinned:
        assert (cache / chart.archive).read_bytes() == (source / chart.archive).read_bytes()
    assert {r for r in requests if r.endswith(".tgz")} == {f"/{c.archive}" for c in served}
    requests.clear()
    assert render("--pull-charts", KUBEADM_STACK, "--check") == 0
    assert requests == []  # everything was cached


def _repackage(folder: Path, chart: versions.HelmChart) -> str:
    """Rewrite the chart's archive with one file more (same chart, another archive, as a
    repository republishing the version would); returns the new digest."""
    path = folder / chart.archive
    with tarfile.open(path) as original:
        members = [(m, original.extractfile(m) if m.isfile() else None) for m in original]
        contents = [(m, f.read() if f else None) for m, f in members]
    with tarfile.open(path, "w:gz") as rewritten:
        for member, data in contents:
            rewritten.addfile(member, io.BytesIO(data) if data is not None else None)
        extra = tarfile.TarInfo(f"{chart.name}/EXTRA.txt")
        extra.size = 3
        rewritten.addfile(extra, io.BytesIO(b"new"))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.charts
def test_pull_refuses_an_archive_the_repository_serves_that_is_not_pinned(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    chart_repository: tuple[str, list[str], Path],
) -> None:
    url, _, served = chart_repository
    pinned = _from(url)
    digest = _repackage(served, versions.PROMETHEUS_ADAPTER)
    helm.repo_index_generate(served, base_url=url)
    cache = tmp_path / "cache"
    monkeypatch.setattr(versions, "PINNED_CHARTS", pinned)
    monkeypatch.setenv(CHART_CACHE_ENV, str(cache))
    assert render("--pull-charts") == 2
    err = capsys.readouterr().err
    archive = cache / versions.PROMETHEUS_ADAPTER.archive
    adapter = next(c for c in pinned if c.name == "prometheus-adapter")
    assert err == (
        f"render: error: cannot pull prometheus-adapter 5.3.0 from {url}: the repository's "
        f"index gives prometheus-adapter-5.3.0.tgz sha256 {digest}, infra/versions.py pins "
        f"{adapter.sha256}\n"
    )
    assert not archive.exists()  # never where the render checks would read it
    assert (cache / versions.KEDA.archive).is_file()  # the others are kept


@pytest.mark.charts
def test_a_cached_archive_that_is_not_pinned_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    for chart in served_charts():
        shutil.copy(chart_cache() / chart.archive, cache / chart.archive)
    monkeypatch.setattr(versions, "PINNED_CHARTS", _from("https://charts.invalid"))
    monkeypatch.delenv(UNPINNED_ENV, raising=False)
    digest = _repackage(cache, versions.KEDA)
    monkeypatch.setenv(CHART_CACHE_ENV, str(cache))
    assert render(EKS_STACK, "--check") == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"render: error: {cache / versions.KEDA.archive} has sha256 {digest}, which "
        "infra/versions.py does not pin for "
        "keda 2.20.2 (pinned: "
    )
    assert "remove it and run `python -m infra.render --pull-charts`" in err
    assert len(err.splitlines()) == 1
