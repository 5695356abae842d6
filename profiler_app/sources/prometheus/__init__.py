"""GPU metrics from Prometheus (dcgm-exporter series), split by concern:

- ``client``: the HTTP client (``PrometheusSource``), one ``query_range`` request per field;
- ``grid``: the time grid shared by every field, and the per-request point limit;
- ``promql``: selectors and duration literals;
- ``documents``: checking Prometheus answers and aligning their series onto the grid;
- ``files``: saved ``query_range`` answers (``analyze --input``);
- ``defaults``: the options' defaults, free of requests and numpy.

The names below load their module on first use: importing ``defaults`` (``--help``) must not
pull in the client's requests and numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler_app.core.lazy import lazy_names
from profiler_app.sources.prometheus.defaults import DEFAULT_MAX_POINTS, DEFAULT_STEP_SECONDS

if TYPE_CHECKING:
    from profiler_app.sources.prometheus.client import PrometheusSource, RequestStats
    from profiler_app.sources.prometheus.documents import (
        fields_in_document,
        parse_query_range,
        query_range_document,
    )
    from profiler_app.sources.prometheus.files import load_query_range
    from profiler_app.sources.prometheus.grid import (
        MAX_POINTS_PER_REQUEST,
        TimeGrid,
        default_step,
        grid_ending_at,
    )
    from profiler_app.sources.prometheus.promql import promql_selector

_HOMES = {
    "PrometheusSource": "client",
    "RequestStats": "client",
    "fields_in_document": "documents",
    "parse_query_range": "documents",
    "query_range_document": "documents",
    "load_query_range": "files",
    "MAX_POINTS_PER_REQUEST": "grid",
    "TimeGrid": "grid",
    "default_step": "grid",
    "grid_ending_at": "grid",
    "promql_selector": "promql",
}

__all__ = [
    "DEFAULT_MAX_POINTS",
    "DEFAULT_STEP_SECONDS",
    "MAX_POINTS_PER_REQUEST",
    "PrometheusSource",
    "RequestStats",
    "TimeGrid",
    "default_step",
    "fields_in_document",
    "grid_ending_at",
    "load_query_range",
    "parse_query_range",
    "promql_selector",
    "query_range_document",
]

if not TYPE_CHECKING:  # hidden from mypy, which checks each name against the imports above
    __getattr__ = lazy_names(__name__, _HOMES)
