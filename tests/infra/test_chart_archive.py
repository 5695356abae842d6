"""`pulumi up` installs each chart of a classic Helm repository from an archive checked against
its pin (infra/chart_archive.py), not by repository and version.

The programs run under Pulumi's mocks as `pulumi up` runs them (``verify_charts``); the chart
repository is Python's http.server on localhost with an index.yaml as Helm writes it, and the
archives are made here (tests/infra/test_store_tools.py says from which upstream files).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pulumi
import pytest

from infra import versions
from infra.chart_archive import ChartError, release_chart
from infra.chart_cache import CHART_CACHE_ENV, UNPINNED_ENV, cached_archive, chart_cache
from infra.platform import helm_release
from infra.render.program import ProgramRun, run_program, run_stack
from infra.versions import HelmChart
from tests.infra.conftest import EKS_STACK, STACK_CHARTS
from tests.infra.test_store_tools import chart_archive_bytes, publish, served

__all__ = ["served"]  # the fixture, shared with the `--pull-charts` tests

ARCHIVE = chart_archive_bytes("keda", "2.20.2")
TAMPERED = chart_archive_bytes("keda", "2.20.2", note="not the publisher's")


def pin(repo: str, content: bytes = ARCHIVE) -> HelmChart:
    return HelmChart("keda", repo, "2.20.2", sha256=hashlib.sha256(content).hexdigest())


def declare(chart: HelmChart) -> ProgramRun:
    """A program declaring one release of ``chart``, run as `pulumi up` runs it."""
    return run_program(
        lambda: helm_release("keda", chart, "keda", {}, pulumi.ResourceOptions()),
        verify_charts=True,
    )


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(CHART_CACHE_ENV, str(folder))
    monkeypatch.delenv(UNPINNED_ENV, raising=False)
    return folder


def test_a_cached_archive_matching_its_pin_is_installed_by_its_path(cache: Path) -> None:
    cache.mkdir()
    (cache / "keda-2.20.2.tgz").write_bytes(ARCHIVE)
    (release,) = declare(pin("http://127.0.0.1:9/unreachable")).releases()
    assert release.inputs["chart"] == str(cache / "keda-2.20.2.tgz")
    assert release.inputs["version"] == "2.20.2"
    assert "repositoryOpts" not in release.inputs  # Helm reads the archive, fetches nothing


def test_a_tampered_cached_archive_is_refused_in_one_line(cache: Path) -> None:
    cache.mkdir()
    (cache / "keda-2.20.2.tgz").write_bytes(TAMPERED)
    chart = pin("http://127.0.0.1:9/unreachable")
    with pytest.raises(ChartError) as refused:
        declare(chart)
    got = hashlib.sha256(TAMPERED).hexdigest()
    assert str(refused.value) == (
        f"chart keda 2.20.2 refused: {cache}/keda-2.20.2.tgz has sha256 {got}, which "
        f"infra/versions.py does not pin for keda 2.20.2 (pinned: {chart.sha256}); remove it to "
        f"fetch the publisher's, or set {UNPINNED_ENV}=1 for a chart you packaged yourself "
        "(development)"
    )
    assert isinstance(refused.value, pulumi.RunError)  # reported without a traceback


def test_a_chart_you_packaged_is_accepted_only_with_the_development_switch(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache.mkdir()
    (cache / "keda-2.20.2.tgz").write_bytes(TAMPERED)
    monkeypatch.setenv(UNPINNED_ENV, "1")
    (release,) = declare(pin("http://127.0.0.1:9/unreachable")).releases()
    assert release.inputs["chart"] == str(cache / "keda-2.20.2.tgz")


def test_a_missing_archive_is_fetched_verified_and_kept(
    cache: Path, served: tuple[Path, str]
) -> None:
    root, url = served
    publish(root, url, {"keda-2.20.2.tgz": ARCHIVE}, {})
    (release,) = declare(pin(url)).releases()
    assert release.inputs["chart"] == str(cache / "keda-2.20.2.tgz")
    assert (cache / "keda-2.20.2.tgz").read_bytes() == ARCHIVE


def test_a_served_archive_unlike_the_pin_is_refused_and_not_kept(
    cache: Path, served: tuple[Path, str]
) -> None:
    root, url = served
    # The repository serves other bytes under the digest it indexes (a swapped archive).
    publish(root, url, {"keda-2.20.2.tgz": TAMPERED}, {"keda-2.20.2.tgz": pin(url).sha256 or ""})
    with pytest.raises(ChartError) as refused:
        declare(pin(url))
    got, expected = hashlib.sha256(TAMPERED).hexdigest(), pin(url).sha256
    assert str(refused.value) == (
        f"cannot fetch chart keda 2.20.2 from {url}: {url}/keda-2.20.2.tgz has sha256 {got}, "
        f"not the {expected} its repository's index gives; not kept"
    )
    assert not (cache / "keda-2.20.2.tgz").exists()


def test_an_unreachable_repository_is_one_line(cache: Path, served: tuple[Path, str]) -> None:
    _, url = served  # serves no index.yaml
    with pytest.raises(ChartError, match=f"^cannot fetch chart keda 2.20.2 from {url}: HTTP"):
        declare(pin(url))


def test_an_oci_chart_stays_a_reference_that_helm_pulls(cache: Path) -> None:
    assert release_chart(versions.KARPENTER) == (
        "oci://public.ecr.aws/karpenter/karpenter",
        None,
    )
    assert not cache.exists()  # nothing fetched


@pytest.mark.charts
def test_the_eks_stack_installs_every_repository_chart_from_its_verified_archive() -> None:
    """The stack as `pulumi up` runs it, charts from the chart cache (checked against the pins,
    or accepted by the development switch where it is set)."""
    run = run_stack(EKS_STACK, verify_charts=True)
    assert {r.inputs["chart"] for r in run.releases()} == {
        chart.reference if chart.is_oci else str(cached_archive(chart, chart_cache()))
        for chart in STACK_CHARTS
    }
    assert [r.name for r in run.releases() if "repositoryOpts" in r.inputs] == []
