"""The store's helpers that run where ``pulumi up`` runs: the RDS CA bundle fetcher, packaging a
chart that only its source repository publishes, and ``render --assume-storage-class``.

Test doubles: Python's http.server on 127.0.0.1 stands in for AWS's trust store and for GitHub's
source archives (neither is reachable here); the certificates are made here with ``cryptography``;
the packaged chart is the pinned local-path-provisioner from the chart cache, re-laid out as the
source repository holds it, and rendered with Helm's own engine.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra import versions
from infra.chart_cache import CHART_CACHE_ENV, cached_archive, chart_cache
from infra.render import __main__ as render_command
from infra.render.charts import ChartError, pull_charts
from infra.store import rds_ca
from infra.versions import HelmChart
from tests.infra.conftest import KUBEADM_STACK
from tests.support.ports import free_port


def certificate_pem(name: str) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP on localhost, and its URL."""
    root = tmp_path / "served"
    root.mkdir()
    handler = type(
        "Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *_: None}
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", free_port()), functools.partial(handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# -- the RDS CA bundle ----------------------------------------------------------------------------


def test_the_bundle_is_the_certificates_of_the_regions_trust_store(
    served: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root, url = served
    first, second = certificate_pem("Amazon RDS eu-west-1 Root CA"), certificate_pem("Other CA")
    (root / "eu-west-1").mkdir()
    (root / "eu-west-1" / "eu-west-1-bundle.pem").write_text(f"{first}\n\n{second}")
    monkeypatch.setattr(rds_ca, "TRUST_STORE", url + "/{region}/{region}-bundle.pem")
    assert rds_ca.main(["eu-west-1"]) == 0
    out = capsys.readouterr().out
    assert out == first.strip() + "\n" + second.strip() + "\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eu-west-1; rm -rf /"], "is not an AWS region name"),
        (["us-east-9"], "cannot download"),
        ([], "usage: python -m infra.store.rds_ca REGION"),
    ],
)
def test_bad_regions_and_failed_downloads_are_one_line(
    served: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.setattr(rds_ca, "TRUST_STORE", served[1] + "/{region}/{region}-bundle.pem")
    assert rds_ca.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_response_without_loadable_certificates_is_refused() -> None:
    with pytest.raises(rds_ca.BundleError, match="no PEM certificate"):
        rds_ca.checked_bundle("<html>Access denied</html>")
    garbled = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    with pytest.raises(rds_ca.BundleError, match="do not load"):
        rds_ca.checked_bundle(garbled)


# -- a chart from its source repository -----------------------------------------------------------


def source_tarball(chart: HelmChart, packaged: Path) -> bytes:
    """What GitHub serves for the tag: ``<repo>-<version>/`` holding the chart in its folder,
    among other files."""
    top = f"local-path-provisioner-{chart.version}"
    out = io.BytesIO()
    with (
        tarfile.open(packaged) as archive,
        tarfile.open(fileobj=out, mode="w:gz") as tarball,
    ):
        readme = tarfile.TarInfo(f"{top}/README.md")
        readme.size = 6
        tarball.addfile(readme, io.BytesIO(b"readme"))
        for member in archive.getmembers():
            inner = member.name.partition("/")[2]
            content = archive.extractfile(member) if member.isfile() else None
            member.name = f"{top}/{chart.source_path}/{inner}".rstrip("/")
            tarball.addfile(member, content)
    return out.getvalue()


def test_a_chart_published_only_as_source_is_packaged_into_the_cache(
    served: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = served
    pinned = versions.LOCAL_PATH_PROVISIONER
    chart = HelmChart(
        name=pinned.name,
        repo=f"{url}/rancher/local-path-provisioner",
        version=pinned.version,
        source_path=pinned.source_path,
    )
    assert chart.source_archive_url == f"{chart.repo}/archive/refs/tags/v{chart.version}.tar.gz"
    archive_dir = root / "rancher" / "local-path-provisioner" / "archive" / "refs" / "tags"
    archive_dir.mkdir(parents=True)
    (archive_dir / f"v{chart.version}.tar.gz").write_bytes(
        source_tarball(chart, cached_archive(pinned))
    )
    cache = tmp_path / "cache"
    # Packaged here, the archive is not the published one: refused, naming its digest...
    with pytest.raises(
        ChartError, match=r"has sha256 \w+, which infra/versions.py does not pin"
    ) as refused:
        pull_charts([chart], cache)
    assert not (cache / chart.archive).exists()
    digest = str(refused.value).split("has sha256 ", 1)[1].split(",", 1)[0]
    # ...and kept once that digest is pinned (packaging the same source gives the same bytes).
    chart = dataclasses.replace(chart, sha256=(digest,))
    (archive,) = pull_charts([chart], cache)
    assert archive == cache / "local-path-provisioner-0.0.37.tgz"
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == digest
    with tarfile.open(archive) as packaged, tarfile.open(cached_archive(pinned)) as original:
        assert sorted(packaged.getnames()) == sorted(original.getnames())
        values = [
            str(bundle.extractfile("local-path-provisioner/values.yaml").read())  # type: ignore[union-attr]
            for bundle in (packaged, original)
        ]
        assert values[0] == values[1]
    # A tag without the chart's folder is one error saying so.
    broken = HelmChart(chart.name, chart.repo, chart.version, source_path="charts/missing")
    with pytest.raises(ChartError, match="has no folder charts/missing"):
        pull_charts([broken], tmp_path / "other-cache")


def test_the_kubeadm_stack_says_how_to_get_a_missing_source_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    for chart in versions.PINNED_CHARTS:
        if not chart.from_source:
            (cache / cached_archive(chart).name).symlink_to(cached_archive(chart))
    monkeypatch.setenv(CHART_CACHE_ENV, str(cache))
    assert render_command.main([str(KUBEADM_STACK)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"render: error: chart local-path-provisioner 0.0.37 is not in the chart cache {cache}: "
        "run `python -m infra.render --pull-charts`"
    )
    assert chart_cache() == cache


# -- render --assume-storage-class ----------------------------------------------------------------


def test_a_storage_class_of_the_cluster_is_assumed_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = KUBEADM_STACK / "inventory.example.ini"
    text = (KUBEADM_STACK / "Pulumi.dev.yaml").read_text()
    config = tmp_path / "Pulumi.ceph.yaml"
    config.write_text(
        text.replace("inventory.example.ini", str(inventory))
        + "  gpu-cluster-kubeadm:profilerDatabase:\n    storageClass: ceph-rbd\n"
    )
    stack = [str(KUBEADM_STACK), "--config", str(config), "--check"]
    assert render_command.main(stack) == 1
    out = capsys.readouterr().out
    assert (
        "scheduling: Cluster gpu-profiler-store/gpu-profiler-store (profiler-store): storage: "
        "StorageClass ceph-rbd is neither created by the stack" in out
    )
    assert render_command.main([*stack, "--assume-storage-class", "ceph-rbd"]) == 0
    assert "all checks pass" in capsys.readouterr().out
