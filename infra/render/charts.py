"""Helm charts from a local chart cache, rendered offline with the real Helm engine.

The cache is a folder of chart archives named ``<chart>-<version>.tgz`` (what ``helm pull``
writes): ``$GPU_CLUSTER_CHART_CACHE``, else ``$XDG_CACHE_HOME/gpu-cluster/charts``. With network
access, :func:`pull_charts` fills it with the versions pinned in ``infra/versions.py``, from where
their publishers serve them: each archive is checked against its repository index's digest, as
Helm does, and against the digest pinned there, before it is kept or read. A cache holding another
archive under a pinned name is refused, naming both digests.

Rendering uses helm-python-sdk (Helm v4's Go SDK): ``helm template`` with the capabilities a
``helm install`` would get from the cluster: its Kubernetes version and the API versions it serves,
CRDs installed before included. The chart's ``crds/`` come first, as Helm installs them first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infra import versions
from infra.chart_archive import ChartError, digest_problem, fetch_archive, file_sha256
from infra.chart_cache import (
    CHART_CACHE_ENV,
    UNPINNED_ENV,
    archive_name,
    cached_archive,
    chart_cache,
    missing_archive_message,
)
from infra.versions import HelmChart

__all__ = [
    "CHART_CACHE_ENV",
    "UNPINNED_ENV",
    "ChartError",
    "archive_name",
    "chart_cache",
    "file_sha256",
]

NOTES_SUFFIX = "NOTES.txt"
# `helm install` never creates these: they run only under `helm test`.
TEST_HOOKS = frozenset({"test", "test-success"})


@dataclass(frozen=True)
class Capabilities:
    """What Helm's ``.Capabilities`` holds during an install: the cluster's version and APIs."""

    kube_version: str  # "v1.31.0"
    api_versions: tuple[str, ...]  # "group/version" and "group/version/Kind"


@dataclass(frozen=True)
class RenderedObject:
    """One object of a rendered chart."""

    manifest: dict[str, Any]
    template: str  # the chart path it came from, or "crds/<file>"
    hook: frozenset[str]  # Helm hook events, empty for ordinary objects


def pinned_chart(name: str, version: str) -> HelmChart:
    """The chart infra/versions.py pins at this name and version; ChartError if none."""
    for chart in versions.PINNED_CHARTS:
        if (chart.name, chart.version) == (name, version):
            return chart
    raise ChartError(
        f"chart {name} {version} is not pinned in infra/versions.py (PINNED_CHARTS), so its "
        f"archive cannot be verified"
    )


def chart_archive(name: str, version: str, cache_dir: Path | None = None) -> Path:
    """The cached archive of a pinned chart, verified; ChartError when missing or not pinned."""
    chart = pinned_chart(name, version)
    folder = cache_dir or chart_cache()
    path = cached_archive(chart, folder)
    if not path.is_file():
        raise ChartError(missing_archive_message(name, version, folder))
    problem = digest_problem(path, chart)
    if problem:
        raise ChartError(
            f"{problem}: the chart cache holds another archive under that name; remove it and "
            f"run `python -m infra.render --pull-charts`, or set {UNPINNED_ENV}=1 if you packaged "
            f"it yourself"
        )
    return path


def missing_archives(charts: Iterable[HelmChart], cache_dir: Path | None = None) -> list[str]:
    """The archives of ``charts`` that the cache lacks."""
    folder = cache_dir or chart_cache()
    return [
        archive_name(chart.name, chart.version)
        for chart in charts
        if not cached_archive(chart, folder).is_file()
    ]


def _pull(chart: HelmChart, folder: Path) -> str | None:
    """Download one chart into ``folder`` and verify it; why it failed, or None."""
    path = cached_archive(chart, folder)
    try:
        if chart.is_oci:
            import helm_python as helm  # noqa: PLC0415  a large native library, loaded on demand

            try:
                helm.pull(chart.reference, version=chart.version, destination=folder)
            except helm.HelmError as error:
                raise ChartError(str(error)) from None
        else:
            fetch_archive(chart, path)
    except (OSError, ValueError, yaml.YAMLError, ChartError) as error:
        return f"cannot pull {chart.name} {chart.version} from {chart.repo}: {error}"
    if not path.is_file():
        return f"pulling {chart.name} {chart.version} did not write {path}"
    problem = digest_problem(path, chart)
    if problem:
        path.unlink()  # never leave an unverified archive where the render checks would read it
        return f"{problem}; not kept"
    return None


def pull_charts(charts: Iterable[HelmChart], cache_dir: Path | None = None) -> list[Path]:
    """Download the charts that the cache lacks from their publishers and verify every archive.

    Returns every archive; ChartError naming each chart that could not be pulled or verified
    (the others are kept).
    """
    folder = cache_dir or chart_cache()
    folder.mkdir(parents=True, exist_ok=True)
    archives, problems = [], []
    for chart in charts:
        path = cached_archive(chart, folder)
        problem = _pull(chart, folder) if not path.is_file() else digest_problem(path, chart)
        if problem:
            problems.append(problem)
        else:
            archives.append(path)
    if problems:
        raise ChartError("\n".join(problems))
    return archives


@cache
def _load(path: Path) -> Any:
    import helm_python as helm  # noqa: PLC0415

    try:
        return helm.Chart.load(path)
    except helm.HelmError as error:
        raise ChartError(f"cannot load chart {path}: {error}") from None


@cache
def _render_text(
    path: Path,
    values_json: str,
    release: str,
    namespace: str,
    capabilities: Capabilities,
    *,
    with_crds: bool,
) -> tuple[tuple[str, str], ...]:
    import helm_python as helm  # noqa: PLC0415
    from helm_python import _native  # noqa: PLC0415

    chart = _load(path)
    # Chart.render() does not pass the capabilities through; the library's render call takes
    # them in its options (helm-c-sdk's RenderOptions: kube_version, api_versions).
    options = {
        "name": release,
        "namespace": namespace,
        "is_install": True,
        "kube_version": capabilities.kube_version,
        "api_versions": list(capabilities.api_versions),
    }
    try:
        rendered = json.loads(
            _native.call_string("helm_render", chart._raw(), values_json, json.dumps(options))
        )
    except helm.HelmError as error:
        raise ChartError(f"chart {path.name} does not render: {error}") from None
    crds = (
        tuple((f"crds/{crd['filename']}", crd["data"]) for crd in chart.crds) if with_crds else ()
    )
    templates = tuple(
        (name, text) for name, text in sorted(rendered.items()) if not name.endswith(NOTES_SUFFIX)
    )
    return crds + templates


class _ManifestLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as Go reads it: a bare ``=`` (PyYAML's "value" tag) is the string "="."""


_ManifestLoader.add_constructor(
    "tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node)
)


@cache
def _documents_json(text: str) -> tuple[str, ...]:
    return tuple(
        json.dumps(doc)
        for doc in yaml.load_all(text, Loader=_ManifestLoader)
        if isinstance(doc, dict) and doc
    )


def _documents(text: str) -> list[dict[str, Any]]:
    """The YAML documents of a manifest; parsed once per process, fresh dicts each call."""
    return [json.loads(doc) for doc in _documents_json(text)]


def served_crd_versions(documents: Iterable[Mapping[str, Any]]) -> set[str]:
    """``group/version`` and ``group/version/Kind`` of every CRD among the documents."""
    served = set()
    for crd in documents:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for version in spec.get("versions", ()):
            if version.get("served", True):
                served.add(f"{spec['group']}/{version['name']}")
                served.add(f"{spec['group']}/{version['name']}/{spec['names']['kind']}")
    return served


def chart_crds(path: Path) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions under a chart's ``crds/`` (dependencies included)."""
    return [doc for crd in _load(path).crds for doc in _documents(crd["data"])]


# Mappings whose keys are the user's own (labels, selectors), whatever the chart's default.
FREE_FORM_KEYS = frozenset(
    {"nodeSelector", "labels", "annotations", "podLabels", "podAnnotations", "additionalLabels"}
)
# Keys a chart reads that its values.yaml documents only in comments.
COMMENTED_KEYS = {
    # templates/metrics-configmap.yaml: `{{- if .Values.customMetrics }}`.
    "dcgm-exporter": frozenset({"customMetrics"}),
    # charts/grafana/templates/ingress.yaml: `{{- if .Values.ingress.ingressClassName }}`;
    # charts/grafana/templates/clusterrole.yaml: `(not .Values.rbac.useExistingClusterRole)`.
    "kube-prometheus-stack": frozenset(
        {"grafana.ingress.ingressClassName", "grafana.rbac.useExistingClusterRole"}
    ),
}


def _with_nulls(merged: dict[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``merged`` plus the keys that coalescing dropped because values.yaml sets them to null."""
    result = dict(merged)
    for key, value in raw.items():
        if key not in result:
            result[key] = value
        elif isinstance(value, dict) and isinstance(result[key], dict):
            result[key] = _with_nulls(result[key], value)
    return result


def chart_defaults(path: Path) -> dict[str, Any]:
    """The values an install starts from: the chart's and its subcharts' values.yaml, coalesced
    (keys documented as null included)."""
    chart = _load(path)
    return _with_nulls(chart.merge_values({}), chart.values)


def unknown_keys(
    values: Mapping[str, Any], defaults: Mapping[str, Any], prefix: str = ""
) -> list[str]:
    """Key paths of ``values`` that the chart's defaults lack: Helm would silently ignore them."""
    unknown = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in defaults:
            unknown.append(path)
            continue
        default = defaults[key]
        if (
            isinstance(value, dict)
            and isinstance(default, dict)
            and default
            and key not in FREE_FORM_KEYS
        ):
            unknown.extend(unknown_keys(value, default, path))
        elif isinstance(value, dict) and default is not None and not isinstance(default, dict):
            unknown.append(f"{path} (a mapping where the chart has a {type(default).__name__})")
    return unknown


def ignored_values(path: Path, values: Mapping[str, Any]) -> list[str]:
    """The keys of ``values`` that the chart at ``path`` has no use for."""
    chart = _load(path).name
    allowed = COMMENTED_KEYS.get(chart, frozenset())
    return [key for key in unknown_keys(values, chart_defaults(path)) if key not in allowed]


def render(
    chart: Path,
    values: Mapping[str, Any],
    release: str,
    namespace: str,
    capabilities: Capabilities,
    *,
    skip_crds: bool = False,
) -> list[RenderedObject]:
    """Every object ``helm install`` would create from a chart, hooks included, tests excluded;
    the chart's ``crds/`` unless ``skip_crds`` (``helm install --skip-crds``).

    Renders are cached per process: rendering kube-prometheus-stack takes about a second.
    """
    values_json = json.dumps(values, sort_keys=True)
    objects = []
    rendered = _render_text(
        chart, values_json, release, namespace, capabilities, with_crds=not skip_crds
    )
    for template, text in rendered:
        for manifest in _documents(text):
            annotations = manifest.get("metadata", {}).get("annotations") or {}
            hook = frozenset(
                event.strip()
                for event in str(annotations.get("helm.sh/hook", "")).split(",")
                if event.strip()
            )
            if hook & TEST_HOOKS:
                continue
            objects.append(RenderedObject(manifest=manifest, template=template, hook=hook))
    return objects
