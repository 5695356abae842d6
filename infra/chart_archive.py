"""Chart archives checked against their pins before Helm installs them.

`pulumi preview` and `pulumi up` install every chart of a classic Helm repository from a local
archive checked here: the chart cache's copy (infra/chart_cache.py) when it has one, else the
archive the repository's index.yaml names, downloaded, checked against the index's digest (as
`helm pull` does) and against the sha256 infra/versions.py pins, and kept in the cache. The
Release is given that archive's path, so Helm installs the bytes that were checked, not whatever
the repository serves a moment later. A chart pinned without a digest (``digest_unknown``) is
checked against its repository's index only.

OCI charts (Karpenter's) stay references: Helm pulls them where `pulumi up` runs and checks the
layer against the digest in the registry's manifest; no digest of theirs is pinned
(infra/versions.py says why).

``$GPU_CLUSTER_CHARTS_UNPINNED=1`` accepts cached archives whatever their digest: charts packaged
by hand for offline development, never a deployment's.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pulumi
import yaml

from infra.chart_cache import UNPINNED_ENV, cached_archive, chart_cache
from infra.versions import HelmChart


class ChartError(pulumi.RunError):
    """A chart that cannot be fetched, verified or rendered; the message says what to do.

    A ``pulumi.RunError``: Pulumi reports its message without a traceback.
    """


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as archive:
        for block in iter(lambda: archive.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def _verified_digest(path: Path, size: int, mtime_ns: int) -> str:
    """The file's digest, computed once per version of the file."""
    return file_sha256(path)


def digest_problem(path: Path, chart: HelmChart) -> str | None:
    """Why the archive at ``path`` is not the chart's archive as its publisher serves it, or None.

    A chart pinned without a digest (``HelmChart.digest_unknown``) was checked against its
    repository's index when it was fetched; there is nothing more to check here.
    ``$GPU_CLUSTER_CHARTS_UNPINNED=1`` accepts archives packaged by hand, whatever their digest.
    """
    if chart.sha256 is None or os.environ.get(UNPINNED_ENV) == "1":
        return None
    status = path.stat()
    digest = _verified_digest(path, status.st_size, status.st_mtime_ns)
    if digest == chart.sha256:
        return None
    return (
        f"{path} has sha256 {digest}, which infra/versions.py does not pin for {chart.name} "
        f"{chart.version} (pinned: {chart.sha256})"
    )


def _get(url: str) -> bytes:
    if not url.startswith(("https://", "http://")):
        raise ChartError(f"{url} is not an http(s) URL")
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310  checked above
        return bytes(response.read())


def index_entry(chart: HelmChart) -> tuple[str, str]:
    """The archive's URL and sha256 as the chart's repository index.yaml gives them."""
    base = chart.repo.rstrip("/") + "/"
    index = yaml.safe_load(_get(base + "index.yaml")) or {}
    for entry in (index.get("entries") or {}).get(chart.name) or ():
        if str(entry.get("version")) == chart.version:
            urls, digest = entry.get("urls") or (), entry.get("digest")
            if not urls or not digest:
                raise ChartError(f"{base}index.yaml gives no url or digest for {chart.archive}")
            return urllib.parse.urljoin(base, str(urls[0])), str(digest)
    raise ChartError(f"{base}index.yaml has no {chart.name} {chart.version}")


def fetch_archive(chart: HelmChart, path: Path) -> None:
    """Download the archive as its repository's index names it, verified against the index's
    digest (as `helm pull` does) and against the pin; written to ``path`` only when it matches."""
    url, indexed = index_entry(chart)
    if chart.sha256 is not None and indexed != chart.sha256:
        raise ChartError(
            f"the repository's index gives {chart.archive} sha256 {indexed}, infra/versions.py "
            f"pins {chart.sha256}"
        )
    content = _get(url)
    digest = hashlib.sha256(content).hexdigest()
    if digest != indexed:
        raise ChartError(
            f"{url} has sha256 {digest}, not the {indexed} its repository's index gives; not kept"
        )
    partial = path.with_name(f".{path.name}.part")
    partial.write_bytes(content)
    partial.replace(path)


def verified_archive(chart: HelmChart, cache_dir: Path | None = None) -> Path:
    """The chart's archive in the cache, fetched first if missing, checked against its pin;
    ChartError (one line naming the chart, the pinned and the actual digest) otherwise."""
    folder = cache_dir or chart_cache()
    path = cached_archive(chart, folder)
    if not path.is_file():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fetch_archive(chart, path)
        except (OSError, ValueError, yaml.YAMLError, ChartError) as error:
            raise ChartError(
                f"cannot fetch chart {chart.name} {chart.version} from {chart.repo}: {error}"
            ) from None
    problem = digest_problem(path, chart)
    if problem:
        raise ChartError(
            f"chart {chart.name} {chart.version} refused: {problem}; remove it to fetch the "
            f"publisher's, or set {UNPINNED_ENV}=1 for a chart you packaged yourself (development)"
        )
    return path


_BY_REFERENCE = [False]


@contextmanager
def charts_by_reference() -> Iterator[None]:
    """Within it, releases name their charts by repository and version and nothing is fetched:
    for programs run under Pulumi's mocks, whose releases infra/render renders from the chart
    cache, verified there (infra/render/charts.py)."""
    _BY_REFERENCE.append(True)
    try:
        yield
    finally:
        _BY_REFERENCE.pop()


def release_chart(chart: HelmChart) -> tuple[str, str | None]:
    """What a helm Release installs: ``(chart, repository)``, the repository None where
    ``chart`` is a verified archive's path or an OCI reference.

    Without a repository, the provider installs a path that exists as it is, whatever the
    Release's version (pulumi/pulumi-kubernetes provider/pkg/provider/helm_release.go:
    locateChart, localChart)."""
    if chart.is_oci:
        return chart.reference, None
    if _BY_REFERENCE[-1]:
        return chart.reference, chart.repo
    return str(verified_archive(chart)), None
