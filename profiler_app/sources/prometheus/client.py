"""The HTTP client: dcgm-exporter fields of one node, one ``query_range`` request per field.

Each field is read with one query for all GPUs of the node (``FIELD{Hostname="node"} or
FIELD{hostname="node"}``: dcgm-exporter spells the label either way, ``exporter_series``) and
aligned onto one time grid shared by every field (``grid``). Transient faults (timeouts, refused
connections, 429 and 5xx answers) raise ``SourceError``, which the daemon retries, waiting at
least the answer's ``Retry-After`` (within its back-off bounds); so does an answer over the byte
cap or past the whole-request deadline (``bounded``). Anything else is a ``UserError`` with one
clear line, credentials masked.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import requests

from profiler_app.core.durations import format_duration
from profiler_app.core.errors import SourceError, UserError
from profiler_app.core.model import (
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    PROF_PREFIX,
    FloatMatrix,
    SeriesMatrix,
    mig_instance,
)
from profiler_app.core.urls import http_url_problem, without_credentials
from profiler_app.profiles.exporter_series import node_label_spellings
from profiler_app.sources.prometheus.bounded import (
    AnswerTooLargeError,
    DeadlinePassedError,
    bounded_get,
    bounded_session,
)
from profiler_app.sources.prometheus.defaults import DEFAULT_DEADLINE_SECONDS, DEFAULT_MAX_BYTES
from profiler_app.sources.prometheus.documents import align, matrix_result, vector_result
from profiler_app.sources.prometheus.grid import (
    MAX_POINTS_PER_REQUEST,
    FloatArray,
    TimeGrid,
    default_step,
    grid_ending_at,
)
from profiler_app.sources.prometheus.promql import promql_selector

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
_ERRNO_REASON = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_TRANSIENT_STATUSES = {429, 502, 503, 504}


def _mig_only(matrices: Sequence[SeriesMatrix]) -> bool:
    """Whether a node without GPU utilisation has MIG instances, which never export it (their
    GR_ENGINE_ACTIVE stands in, ``profiles``)."""
    return matrices[0].field == GPU_UTIL and any(
        matrix.field == GR_ENGINE_ACTIVE and any(mig_instance(labels) for labels in matrix.labels)
        for matrix in matrices
    )


@dataclass
class RequestStats:
    """What the source cost Prometheus since it was created."""

    requests: int = 0
    bytes_read: int = 0


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
        max_bytes: int = DEFAULT_MAX_BYTES,
        deadline_seconds: float = DEFAULT_DEADLINE_SECONDS,
    ) -> None:
        if problem := http_url_problem(url):
            shown = without_credentials(url)
            raise UserError(
                f"invalid Prometheus URL {shown!r} ({problem}): expected http://HOST:PORT"
            )
        if not fields:
            raise UserError("no fields to read: give at least one --field")
        if step_seconds is not None and not step_seconds > 0:
            raise UserError("step must be a positive duration")
        self.url = url.rstrip("/")
        self.display_url = without_credentials(self.url)  # for messages and logs
        self.node = node
        self.node_label = node_label
        self.fields = list(fields)
        # dcgm-exporter renamed Hostname to hostname after 4.5.3-4.8.2: either spelling is read.
        spellings = node_label_spellings(node_label)
        self.queries = [
            " or ".join(promql_selector(field, label, node) for label in spellings)
            for field in self.fields
        ]
        self.step_seconds = step_seconds
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.deadline_seconds = deadline_seconds
        self.stats = RequestStats()
        # Fields a cycle may do without (the daemon's extras): missing ones are skipped, said once.
        self.optional_fields = frozenset(optional_fields) - {self.fields[0]}
        self._missing_said: set[str] = set()
        self._session = session or bounded_session()

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
                    # DCGM's profiling fields are not on every GPU: no warning without them.
                    say = log.debug if field.startswith(PROF_PREFIX) else log.warning
                    say(
                        "%s; going on without it", self._no_series_message(field, 1, window_seconds)
                    )
                continue
            if not series and position > 0:
                raise UserError(self._no_series_message(field, position, window_seconds))
            labels, values = align(series, grid)
            matrices.append(SeriesMatrix(field, labels, grid.timestamps(), values, step))
        if not matrices[0].labels and not _mig_only(matrices):
            raise UserError(self._no_series_message(self.fields[0], 0, window_seconds))
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
        return matrix_result(document, f"the answer of {self.display_url}")

    def range_query(
        self, query: str, window_seconds: float, end: float | None = None
    ) -> tuple[list[dict[str, str]], FloatMatrix, FloatArray]:
        """(labels, values, timestamps) of ``query`` over the window on the grid ``read``
        uses (one request, more only where the grid exceeds Prometheus' points per request)."""
        step = self.step_seconds or default_step(window_seconds)
        grid = grid_ending_at(time.time() if end is None else end, window_seconds, step)
        series = [
            item
            for chunk in grid.chunks(MAX_POINTS_PER_REQUEST)
            for item in self._query(query, chunk)
        ]
        labels, values = align(series, grid)
        return labels, values, grid.timestamps()

    def instant_query(self, query: str, at: float) -> list[dict[str, object]]:
        """The vector result of ``query`` evaluated at ``at`` (same errors as ``read``)."""
        document = self._request("query", {"query": query, "time": _timestamp(at)}, query)
        return vector_result(document, f"the answer of {self.display_url}")

    def _request(self, api: str, params: dict[str, str], query: str) -> object:
        endpoint = f"{self.url}/api/v1/{api}"
        try:
            response, body = bounded_get(
                self._session,
                endpoint,
                params,
                read_timeout=self.timeout,
                deadline_seconds=self.deadline_seconds,
                max_bytes=self.max_bytes,
            )
        except DeadlinePassedError as error:
            raise SourceError(
                f"Prometheus at {self.display_url} did not answer {api} within "
                f"{self.deadline_seconds:g}s (the whole-request deadline, "
                "--prometheus-deadline): gave up"
            ) from error
        except AnswerTooLargeError as error:
            raise SourceError(
                f"Prometheus at {self.display_url} answered {api} with more than "
                f"{self.max_bytes:,} bytes (--prometheus-max-bytes): not read further"
            ) from error
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
        self.stats.bytes_read += len(body)
        return _document_of(response, body, self.display_url, query)


def _timestamp(seconds: float) -> str:
    return f"{seconds:.3f}"


def _short_reason(error: Exception) -> str:
    """'Connection refused' rather than urllib3's nested repr."""
    match = _ERRNO_REASON.search(str(error))
    return match.group(1).strip() if match else type(error).__name__


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """An HTTP Retry-After header in seconds: a number of seconds or an HTTP date; None when
    absent or unreadable. The caller's back-off caps it."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _document_of(response: requests.Response, body: bytearray, url: str, query: str) -> object:
    """The JSON answer, after mapping HTTP errors to SourceError (transient) or UserError."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested thousands deep
        document = None
    error = document.get("error") if isinstance(document, dict) else None
    if response.status_code >= 500 or response.status_code in _TRANSIENT_STATUSES:
        detail = f": {error}" if error else ""
        retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        asked = "" if retry_after is None else f"; it asks to retry in {retry_after:g}s"
        raise SourceError(
            f"Prometheus at {url} answered HTTP {response.status_code}{detail}{asked}",
            retry_after=retry_after,
        )
    if response.status_code >= 400:
        detail = error or response.reason or "no error message"
        raise UserError(
            f"Prometheus at {url} rejected {query} (HTTP {response.status_code}): {detail}"
        )
    if document is None:
        raise UserError(f"{url} does not look like Prometheus: its answer is not JSON")
    return document
