"""GPU metrics from Prometheus (dcgm-exporter series), one ``query_range`` request per field.

Each field is read with one selector for all GPUs of the node (``FIELD{Hostname="node"}``) and
aligned onto one time grid shared by every field: ``end`` is the current time rounded down to a
multiple of the step, and the grid holds ``window / step + 1`` points before it.

Prometheus refuses more than 11,000 points per series in one request. The default step never
gets there (it coarsens with the window, see ``default_step``); an explicit step that would
exceed it is honoured by splitting the range into consecutive requests on the same grid and
concatenating them, so only such explicit fine steps cost more than one request per field.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt
import requests

from profiler_app.durations import format_duration
from profiler_app.errors import SourceError, UserError
from profiler_app.model import GPU_UTIL, FloatMatrix, SeriesMatrix
from profiler_app.sources.host import PodPeak

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]

MAX_POINTS_PER_REQUEST = 11_000  # Prometheus' per-series limit for query_range
DEFAULT_STEP_SECONDS = 10.0  # dcgm-exporter collects every 30 s by default; 10 s loses nothing
DEFAULT_MAX_POINTS = 1_000  # the default step coarsens so a window has at most this many points
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_POINTS_PER_READ = 10 * MAX_POINTS_PER_REQUEST  # beyond this a finer step is a mistake

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ERRNO_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_TRANSIENT_STATUSES = {429, 502, 503, 504}
CADVISOR_NODE_LABEL = "node"  # the node label kube-prometheus-stack puts on cAdvisor series
CADVISOR_RATE_WINDOW = "2m"  # four kubelet scrapes at its 30 s default


def default_step(window_seconds: float) -> float:
    """10 s, or coarser (whole seconds) so the window holds at most ``DEFAULT_MAX_POINTS``."""
    return max(DEFAULT_STEP_SECONDS, float(math.ceil(window_seconds / DEFAULT_MAX_POINTS)))


def promql_selector(field: str, label: str, value: str) -> str:
    """``field{label="value"}`` with the value escaped as a PromQL string literal."""
    if not _METRIC_NAME.fullmatch(field):
        raise UserError(f"invalid metric name {field!r}: expected e.g. {GPU_UTIL}")
    if not _LABEL_NAME.fullmatch(label):
        raise UserError(f"invalid label name {label!r}: expected e.g. Hostname")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{field}{{{label}="{escaped}"}}'


@dataclass
class RequestStats:
    """What the source cost Prometheus since it was created."""

    requests: int = 0
    bytes_read: int = 0


@dataclass(frozen=True)
class TimeGrid:
    """Evenly spaced evaluation times ``start + k * step`` for ``k`` in ``range(points)``."""

    start: float
    step: float
    points: int

    @property
    def end(self) -> float:
        return self.start + (self.points - 1) * self.step

    def timestamps(self) -> FloatArray:
        return self.start + self.step * np.arange(self.points, dtype=np.float64)

    def chunks(self, max_points: int) -> list[TimeGrid]:
        """Consecutive sub-grids of at most ``max_points`` points covering this grid."""
        return [
            TimeGrid(
                self.start + first * self.step, self.step, min(max_points, self.points - first)
            )
            for first in range(0, self.points, max_points)
        ]


def grid_ending_at(end: float, window_seconds: float, step_seconds: float) -> TimeGrid:
    """The grid of a ``window_seconds`` window ending at ``end`` (rounded down to the step)."""
    if not window_seconds > 0 or not step_seconds > 0:
        raise UserError("window and step must be positive durations")
    if step_seconds > window_seconds:
        raise UserError(
            f"step {format_duration(step_seconds)} is longer than the window "
            f"{format_duration(window_seconds)}"
        )
    aligned_end = math.floor(end / step_seconds) * step_seconds
    points = int(window_seconds // step_seconds) + 1
    if points > MAX_POINTS_PER_READ:
        raise UserError(
            f"a {format_duration(window_seconds)} window at a {format_duration(step_seconds)} "
            f"step is {points:,} points per GPU; use a coarser step (at most "
            f"{MAX_POINTS_PER_READ:,} points)"
        )
    return TimeGrid(aligned_end - (points - 1) * step_seconds, step_seconds, points)


class PrometheusSource:
    """Reads dcgm-exporter fields of one node from Prometheus' HTTP API."""

    def __init__(
        self,
        url: str,
        node: str,
        node_label: str = "Hostname",
        fields: Sequence[str] = (GPU_UTIL,),
        step_seconds: float | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        session: requests.Session | None = None,
        optional_fields: Collection[str] = (),
    ) -> None:
        if not url.startswith(("http://", "https://")) or not _has_valid_port(url):
            shown = without_credentials(url)
            raise UserError(f"invalid Prometheus URL {shown!r}: expected http://HOST:PORT")
        if not fields:
            raise UserError("no fields to read: give at least one --field")
        if step_seconds is not None and not step_seconds > 0:
            raise UserError("step must be a positive duration")
        self.url = url.rstrip("/")
        self.display_url = without_credentials(self.url)  # for messages and logs
        self.node = node
        self.node_label = node_label
        self.fields = list(fields)
        self.queries = [promql_selector(field, node_label, node) for field in self.fields]
        self.step_seconds = step_seconds
        self.timeout = timeout
        self.stats = RequestStats()
        # Fields a cycle may do without (the daemon's extras): missing ones are skipped, said once.
        self.optional_fields = frozenset(optional_fields) - {self.fields[0]}
        self._missing_said: set[str] = set()
        self._session = session or requests.Session()

    def read(self, window_seconds: float, end: float | None = None) -> list[SeriesMatrix]:
        """One matrix per field over the window ending at ``end`` (default: now)."""
        step = self.step_seconds or default_step(window_seconds)
        grid = grid_ending_at(time.time() if end is None else end, window_seconds, step)
        matrices = []
        for position, (field, query) in enumerate(zip(self.fields, self.queries, strict=True)):
            series = [
                item
                for chunk in grid.chunks(MAX_POINTS_PER_REQUEST)
                for item in self._query(query, chunk)
            ]
            if not series and field in self.optional_fields:
                if field not in self._missing_said:
                    self._missing_said.add(field)
                    log.warning(
                        "%s; going on without it", self._no_series_message(field, 1, window_seconds)
                    )
                continue
            if not series:
                raise UserError(self._no_series_message(field, position, window_seconds))
            labels, values = _align(series, grid)
            matrices.append(SeriesMatrix(field, labels, grid.timestamps(), values, step))
        return matrices

    def close(self) -> None:
        self._session.close()

    def _no_series_message(self, field: str, position: int, window_seconds: float) -> str:
        where = f"{self.node_label}={self.node} in the last {format_duration(window_seconds)}"
        if position == 0:
            return f"no series for {where}: unknown node or no dcgm-exporter data in the window"
        return f"no {field} series for {where}: dcgm-exporter does not export this field"

    def _query(self, query: str, grid: TimeGrid) -> list[dict[str, object]]:
        params = {"query": query, "start": _timestamp(grid.start), "end": _timestamp(grid.end)}
        params["step"] = _timestamp(grid.step)
        document = self._request("query_range", params, query)
        return _matrix_result(document, f"the answer of {self.display_url}")

    def instant_query(self, query: str, at: float) -> list[dict[str, object]]:
        """The vector result of ``query`` evaluated at ``at`` (same errors as ``read``)."""
        document = self._request("query", {"query": query, "time": _timestamp(at)}, query)
        return _vector_result(document, f"the answer of {self.display_url}")

    def _request(self, api: str, params: dict[str, str], query: str) -> object:
        endpoint = f"{self.url}/api/v1/{api}"
        try:
            response = self._session.get(endpoint, params=params, timeout=self.timeout)
        except requests.Timeout as error:
            raise SourceError(
                f"Prometheus at {self.display_url} timed out after {self.timeout:g}s"
            ) from error
        except requests.ConnectionError as error:
            raise SourceError(
                f"cannot reach Prometheus at {self.display_url}: {_short_reason(error)}"
            ) from error
        except requests.RequestException as error:
            raise UserError(
                f"cannot query Prometheus at {self.display_url}: {type(error).__name__}"
            ) from error
        self.stats.requests += 1
        self.stats.bytes_read += len(response.content)
        return _document_of(response, self.display_url, query)


class PodPeaksQuery:
    """Each pod's CPU and memory peaks on one node from cAdvisor series (the kubelet's, as
    kube-prometheus-stack scrapes them): two instant queries with subqueries per read.

    For the DaemonSet, which cannot see the host cgroup tree. Rows of pod-level cgroups
    (``container=""``) and pause containers (``container="POD"``) are left out so a pod's
    containers are summed once. No cAdvisor series is not an error: the result is empty.
    """

    def __init__(self, source: PrometheusSource, node_label: str = CADVISOR_NODE_LABEL) -> None:
        self.source = source
        self.node_label = node_label
        self._empty_said = False
        # Containers only: the pod-level cgroup ("") and the pause container ("POD") would
        # count the pod twice.
        containers_only = ',container!="",container!="POD"}'
        self.cpu_selector = (
            promql_selector("container_cpu_usage_seconds_total", node_label, source.node)[:-1]
            + containers_only
        )
        self.memory_selector = (
            promql_selector("container_memory_working_set_bytes", node_label, source.node)[:-1]
            + containers_only
        )

    def queries(self, window_seconds: float) -> tuple[str, str]:
        """(CPU percent of one core, working-set bytes): per-pod peaks within the window."""
        step = self.source.step_seconds or default_step(window_seconds)
        subquery = f"[{_promql_duration(window_seconds)}:{_promql_duration(step)}]"
        cpu = (
            f"max_over_time((sum by (namespace, pod) (rate({self.cpu_selector}"
            f"[{CADVISOR_RATE_WINDOW}])))"
            f"{subquery}) * 100"
        )
        memory = f"max_over_time((sum by (namespace, pod) ({self.memory_selector})){subquery})"
        return cpu, memory

    def read(
        self, window_seconds: float, end: float | None = None
    ) -> dict[tuple[str, str], PodPeak]:
        """(namespace, pod) -> peaks; a pod missing from one query has None for that resource."""
        at = time.time() if end is None else end
        cpu_query, memory_query = self.queries(window_seconds)
        cpu = _by_pod(self.source.instant_query(cpu_query, at))
        memory = _by_pod(self.source.instant_query(memory_query, at))
        if not cpu and not memory and not self._empty_said:
            self._empty_said = True
            log.info(
                "no cAdvisor series for %s=%s in Prometheus: pods get no CPU/memory peaks",
                self.node_label,
                self.source.node,
            )
        return {
            key: PodPeak(cpu_util_max=cpu.get(key), mem_used_max_bytes=memory.get(key))
            for key in sorted(cpu.keys() | memory.keys())
        }


def _by_pod(samples: list[dict[str, object]]) -> dict[tuple[str, str], float]:
    values = {}
    for sample in samples:
        metric: dict[str, str] = sample["metric"]  # type: ignore[assignment]
        pair: list[object] = sample["value"]  # type: ignore[assignment]
        try:
            value = float(pair[1])  # type: ignore[arg-type]
        except (TypeError, ValueError) as error:
            raise UserError(f"malformed sample in an instant query answer: {error}") from error
        if "namespace" in metric and "pod" in metric and math.isfinite(value):
            values[str(metric["namespace"]), str(metric["pod"])] = value
    return values


def _promql_duration(seconds: float) -> str:
    """A PromQL duration literal: whole seconds where possible, else milliseconds."""
    milliseconds = max(1, round(seconds * 1000))
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def _has_valid_port(url: str) -> bool:
    try:
        urlsplit(url).port  # noqa: B018 - parsing it is the check
    except ValueError:
        return False
    return True


def without_credentials(url: str) -> str:
    """The URL without user:password, which must never reach a message or a log."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def _timestamp(seconds: float) -> str:
    return f"{seconds:.3f}"


def _short_reason(error: Exception) -> str:
    """'Connection refused' rather than urllib3's nested repr."""
    match = _ERRNO_REASON.search(str(error))
    return match.group(1).strip() if match else type(error).__name__


def _document_of(response: requests.Response, url: str, query: str) -> object:
    """The JSON answer, after mapping HTTP errors to SourceError (transient) or UserError."""
    try:
        document = response.json()
    except ValueError:
        document = None
    error = document.get("error") if isinstance(document, dict) else None
    if response.status_code >= 500 or response.status_code in _TRANSIENT_STATUSES:
        detail = f": {error}" if error else ""
        raise SourceError(f"Prometheus at {url} answered HTTP {response.status_code}{detail}")
    if response.status_code >= 400:
        detail = error or response.reason or "no error message"
        raise UserError(
            f"Prometheus at {url} rejected {query} (HTTP {response.status_code}): {detail}"
        )
    if document is None:
        raise UserError(f"{url} does not look like Prometheus: its answer is not JSON")
    return document


def _matrix_result(document: object, origin: str) -> list[dict[str, object]]:
    """The ``data.result`` list of a successful matrix document, checked item by item."""
    problem = f"{origin} is not a Prometheus query_range document"
    return _result(document, problem, "matrix", _is_series, "{metric, values} series")


def _vector_result(document: object, origin: str) -> list[dict[str, object]]:
    """The ``data.result`` list of a successful instant-vector document."""
    problem = f"{origin} is not a Prometheus instant query document"
    return _result(document, problem, "vector", _is_sample, "{metric, value} samples")


def _result(
    document: object,
    problem: str,
    result_type: str,
    is_item: Callable[[object], bool],
    items: str,
) -> list[dict[str, object]]:
    """``data.result`` of a successful ``result_type`` document whose every item passes
    ``is_item``; else UserError, ``problem`` followed by what is wrong."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(document, dict) or not isinstance(data, dict):
        raise UserError(f"{problem}: no 'data' object")
    if document.get("status") != "success":
        raise UserError(f"{problem}: status is {document.get('status')!r}, expected 'success'")
    if data.get("resultType") != result_type:
        raise UserError(
            f"{problem}: resultType is {data.get('resultType')!r}, expected {result_type!r}"
        )
    result = data.get("result")
    if not isinstance(result, list) or not all(is_item(item) for item in result):
        raise UserError(f"{problem}: data.result is not a list of {items}")
    return result


def _is_sample(item: object) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("metric"), dict)
        and isinstance(item.get("value"), list)
        and len(item["value"]) == 2
    )


def _is_series(item: object) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("metric"), dict)
        and isinstance(item.get("values"), list)
        and all(isinstance(pair, list) and len(pair) == 2 for pair in item["values"])
    )


def _series_arrays(item: dict[str, object]) -> tuple[FloatArray, FloatArray]:
    pairs: list[list[object]] = item["values"]  # type: ignore[assignment]
    try:
        times = np.array([pair[0] for pair in pairs], dtype=np.float64)
        values = np.array([pair[1] for pair in pairs], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise UserError(f"malformed sample in a query_range series: {error}") from error
    return times, values


def _align(
    series: Iterable[dict[str, object]], grid: TimeGrid
) -> tuple[list[dict[str, str]], FloatMatrix]:
    """Rows on ``grid`` (NaN where a series has no sample), one per distinct label set.

    Chunked requests return the same series once per chunk; their samples land in one row.
    """
    rows: dict[tuple[tuple[str, str], ...], int] = {}
    labels: list[dict[str, str]] = []
    placed: list[tuple[int, FloatArray, FloatArray]] = []
    for item in series:
        metric = {str(k): str(v) for k, v in item["metric"].items()}  # type: ignore[attr-defined]
        metric.pop("__name__", None)
        key = tuple(sorted(metric.items()))
        if key not in rows:
            rows[key] = len(labels)
            labels.append(metric)
        times, values = _series_arrays(item)
        placed.append((rows[key], times, values))
    matrix = np.full((len(labels), grid.points), np.nan)
    for row, times, values in placed:
        columns = np.rint((times - grid.start) / grid.step).astype(np.int64)
        inside = (columns >= 0) & (columns < grid.points)
        matrix[row, columns[inside]] = values[inside]
    return labels, matrix


MAX_INFERRED_POINTS = 1_000_000  # a saved document whose timestamps imply more is not a range query


def fields_in_document(document: object, origin: str = "the document") -> list[str]:
    """Distinct ``__name__`` labels of a query_range document, in order of appearance."""
    names: dict[str, None] = {}
    for item in _matrix_result(document, origin):
        name = item["metric"].get("__name__")  # type: ignore[attr-defined]
        if name is not None:
            names[str(name)] = None
    return list(names)


def parse_query_range(document: object, field: str, origin: str = "the document") -> SeriesMatrix:
    """The series of ``field`` in a saved ``/api/v1/query_range`` answer, on an inferred grid.

    Series named ``field`` by their ``__name__`` label are taken, and so are series without a
    ``__name__`` (a query such as ``max by (gpu) (...)`` drops it). The step is the smallest
    distance between two sample times.
    """
    selected = [
        item
        for item in _matrix_result(document, origin)
        if item["metric"].get("__name__", field) == field  # type: ignore[attr-defined]
    ]
    if not selected:
        raise UserError(f"{origin} has no {field} series")
    times = np.unique(np.concatenate([_series_arrays(item)[0] for item in selected]))
    if times.size == 0:
        raise UserError(f"{origin} has {field} series without samples")
    gaps = np.diff(times)
    step = float(np.round(gaps.min(), 3)) if gaps.size else 1.0
    if not step > 0:
        raise UserError(f"{origin} has {field} samples closer than a millisecond")
    points = round(float(times[-1] - times[0]) / step) + 1
    if points > MAX_INFERRED_POINTS:
        raise UserError(
            f"{origin}: {field} samples are not evenly spaced like a query_range answer"
        )
    grid = TimeGrid(float(times[0]), step, points)
    labels, values = _align(selected, grid)
    return SeriesMatrix(field, labels, grid.timestamps(), values, step)


def load_query_range(path: str, fields: Sequence[str] | None = None) -> list[SeriesMatrix]:
    """Matrices from a saved query_range JSON file: the given fields, or every field in it."""
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except FileNotFoundError as error:
        raise UserError(f"{path}: no such file") from error
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid JSON: {error}") from error
    wanted = list(fields) if fields else fields_in_document(document, path)
    if not wanted:
        raise UserError(f"{path}: series carry no __name__ label; say which field with --field")
    return [parse_query_range(document, field, path) for field in wanted]


def query_range_document(matrix: SeriesMatrix) -> dict[str, object]:
    """A matrix as Prometheus would answer it (NaN samples left out): for saving dumps."""
    result = []
    for labels, row in zip(matrix.labels, matrix.values, strict=True):
        present = ~np.isnan(row)
        values = [
            [round(float(t), 3), _sample_text(float(v))]
            for t, v in zip(matrix.timestamps[present], row[present], strict=True)
        ]
        metric = {"__name__": matrix.field, **labels}
        result.append({"metric": metric, "values": values})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def _sample_text(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)
