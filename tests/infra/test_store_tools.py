"""Helpers that fetch what the stacks need: the RDS CA bundle fetcher, `--pull-charts` from the
publishers' Helm repositories, and ``render --assume-storage-class``.

Test doubles: Python's http.server on 127.0.0.1 stands in for AWS's trust store and for a Helm
chart repository (its index.yaml with the fields `helm pull` reads: helm/helm@v3.16.0
pkg/repo/index.go), neither reachable from a test; the certificates and chart archives are made
here (``cryptography``; a Chart.yaml in a folder named after the chart, as `helm package` writes).
"""

from __future__ import annotations

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
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra import versions
from infra.chart_cache import CHART_CACHE_ENV
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


# -- charts from their publishers' Helm repositories ----------------------------------------------


def chart_archive_bytes(name: str, version: str, note: str = "") -> bytes:
    """A minimal chart archive as `helm package` lays it out: one top folder named after the
    chart, holding Chart.yaml (helm/helm@v3.16.0: pkg/chart/loader/archive.go)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path, text in (
            (f"{name}/Chart.yaml", f"apiVersion: v2\nname: {name}\nversion: {version}\n"),
            (f"{name}/values.yaml", f"note: {note!r}\n"),
        ):
            member = tarfile.TarInfo(path)
            member.size = len(text.encode())
            archive.addfile(member, io.BytesIO(text.encode()))
    return out.getvalue()


def publish(root: Path, url: str, archives: dict[str, bytes], digests: dict[str, str]) -> None:
    """A Helm repository: the archives and an index.yaml naming each with its url and digest,
    the fields `helm pull` reads (helm/helm@v3.16.0: pkg/repo/index.go, ChartVersion's URLs and
    Digest); ``digests`` overrides the true digest of an archive."""
    entries: dict[str, list[dict[str, object]]] = {}
    for file, content in archives.items():
        (root / file).write_bytes(content)
        name, _, version = file.removesuffix(".tgz").rpartition("-")
        entries.setdefault(name, []).append(
            {
                "apiVersion": "v2",
                "name": name,
                "version": version,
                "urls": [file if name != "keda" else f"{url}/{file}"],  # relative and absolute
                "digest": digests.get(file, hashlib.sha256(content).hexdigest()),
            }
        )
    (root / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "entries": entries}))


def test_pull_keeps_every_archive_it_fetched_and_verified(
    served: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = served
    plugin, keda = (
        chart_archive_bytes("nvidia-device-plugin", "0.20.0"),
        chart_archive_bytes("keda", "2.20.2"),
    )
    publish(root, url, {"nvidia-device-plugin-0.20.0.tgz": plugin, "keda-2.20.2.tgz": keda}, {})
    charts = [
        # Pinned: the index's digest must be the pin, and the archive must match both.
        HelmChart("nvidia-device-plugin", url, "0.20.0", sha256=hashlib.sha256(plugin).hexdigest()),
        # Not pinned: the index's digest alone, as Helm checks it.
        HelmChart("keda", url, "2.20.2", digest_unknown="not read"),
    ]
    cache = tmp_path / "cache"
    archives = pull_charts(charts, cache)
    assert archives == [cache / "nvidia-device-plugin-0.20.0.tgz", cache / "keda-2.20.2.tgz"]
    assert [a.read_bytes() for a in archives] == [plugin, keda]
    assert sorted(p.name for p in cache.iterdir()) == sorted(a.name for a in archives)
    # Kept: a second pull reads the cache and fetches nothing.
    (root / "index.yaml").unlink()
    assert pull_charts(charts, cache) == archives


def test_an_archive_unlike_its_index_digest_is_refused_in_one_line(
    served: tuple[Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, url = served
    good = chart_archive_bytes("keda", "2.20.2")
    swapped = chart_archive_bytes("prometheus-adapter", "5.3.0", note="republished")
    indexed = hashlib.sha256(chart_archive_bytes("prometheus-adapter", "5.3.0")).hexdigest()
    publish(
        root,
        url,
        {"keda-2.20.2.tgz": good, "prometheus-adapter-5.3.0.tgz": swapped},
        {"prometheus-adapter-5.3.0.tgz": indexed},
    )
    charts = (
        HelmChart("keda", url, "2.20.2", digest_unknown="not read"),
        HelmChart("prometheus-adapter", url, "5.3.0", digest_unknown="not read"),
    )
    cache = tmp_path / "cache"
    monkeypatch.setattr(versions, "PINNED_CHARTS", charts)
    monkeypatch.setenv(CHART_CACHE_ENV, str(cache))
    assert render_command.main(["--pull-charts"]) == 2
    actual = hashlib.sha256(swapped).hexdigest()
    assert capsys.readouterr().err == (
        f"render: error: cannot pull prometheus-adapter 5.3.0 from {url}: "
        f"{url}/prometheus-adapter-5.3.0.tgz has sha256 {actual}, not the {indexed} its "
        "repository's index gives; not kept\n"
    )
    assert sorted(p.name for p in cache.iterdir()) == ["keda-2.20.2.tgz"]  # the other is kept


def test_an_index_digest_unlike_the_pin_is_refused(
    served: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = served
    content = chart_archive_bytes("dcgm-exporter", "4.8.2")
    publish(root, url, {"dcgm-exporter-4.8.2.tgz": content}, {})
    chart = HelmChart("dcgm-exporter", url, "4.8.2", sha256="0" * 64)
    with pytest.raises(ChartError) as refused:
        pull_charts([chart], tmp_path / "cache")
    assert str(refused.value) == (
        f"cannot pull dcgm-exporter 4.8.2 from {url}: the repository's index gives "
        f"dcgm-exporter-4.8.2.tgz sha256 {hashlib.sha256(content).hexdigest()}, "
        f"infra/versions.py pins {'0' * 64}"
    )
    assert not (tmp_path / "cache" / "dcgm-exporter-4.8.2.tgz").exists()


def test_a_version_missing_from_the_index_is_one_error(
    served: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = served
    publish(root, url, {"keda-2.20.1.tgz": chart_archive_bytes("keda", "2.20.1")}, {})
    with pytest.raises(ChartError, match=f"^cannot pull keda 2.20.2 from {url}: "):
        pull_charts([HelmChart("keda", url, "2.20.2", digest_unknown="x")], tmp_path / "c")


def test_every_pinned_chart_pins_a_publisher_digest_or_says_why_not() -> None:
    for chart in versions.PINNED_CHARTS:
        assert (chart.sha256 is None) == bool(chart.digest_unknown), chart.name
    with pytest.raises(ValueError, match="pin sha256, or say in digest_unknown why it is not"):
        HelmChart("x", "https://example.org", "1.0.0")


# -- render --assume-storage-class ----------------------------------------------------------------


@pytest.mark.charts
def test_a_storage_class_of_the_cluster_is_assumed_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = KUBEADM_STACK / "inventory.example.ini"
    text = (KUBEADM_STACK / "Pulumi.example.yaml").read_text()
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
