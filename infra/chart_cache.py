"""Where chart archives are kept: the chart cache, ``<chart>-<version>.tgz`` files (what
``helm pull`` writes). ``$GPU_CLUSTER_CHART_CACHE``, else ``$XDG_CACHE_HOME/gpu-cluster/charts``.

``python -m infra.render`` renders from it (``--pull-charts`` fills it); the stacks install their
repository charts from it, each archive checked against its pin first (infra/chart_archive.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.versions import HelmChart

CHART_CACHE_ENV = "GPU_CLUSTER_CHART_CACHE"
# "1": read archives whose digest is not the publisher's (charts packaged by hand, offline).
UNPINNED_ENV = "GPU_CLUSTER_CHARTS_UNPINNED"


def chart_cache() -> Path:
    """The chart cache folder (it need not exist)."""
    configured = os.environ.get(CHART_CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-cluster" / "charts"


def archive_name(name: str, version: str) -> str:
    """A chart archive's file name, for a chart known by name and version (HelmChart.archive)."""
    return f"{name}-{version}.tgz"


def cached_archive(chart: HelmChart, cache_dir: Path | None = None) -> Path:
    """The path of a chart's archive in the cache (whether or not it is there)."""
    return (cache_dir or chart_cache()) / chart.archive


def missing_archive_message(name: str, version: str, folder: Path) -> str:
    return (
        f"chart {name} {version} is not in the chart cache {folder}: run "
        f"`python -m infra.render --pull-charts` where the chart repositories are reachable, "
        f"or set {CHART_CACHE_ENV} to a folder holding {archive_name(name, version)}"
    )
