"""Prometheus queries over a trial's pods: the user's PromQL rate, and dcgm-exporter's fields
of the GPUs the pods hold (dcgm-exporter labels a GPU's series with the pod using it).

``$POD`` in a user's expression becomes the trial's pod names as a regular expression
alternation (use it as ``pod=~"$POD"``); when the expression gives several series they are added
up, sample by sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import requests

from profiler_app.core.errors import UserError
from profiler_app.core.model import FB_USED, GPU_UTIL, SM_ACTIVE, FloatMatrix
from profiler_app.core.urls import http_url_problem, without_credentials
from profiler_app.sources.prometheus.documents import align, matrix_result
from profiler_app.sources.prometheus.grid import FloatArray, TimeGrid

POD_PLACEHOLDER = "$POD"
TIMEOUT_SECONDS = 10.0


class MetricsUnavailableError(Exception):
    """Prometheus could not answer now (down, slow, an error): the trial is measured without."""


def pod_regex(pods: Sequence[str]) -> str:
    """Pod names (lowercase letters, digits, '-' and '.') as a regex inside a PromQL string:
    only the dot needs escaping, with its backslash doubled for the string literal."""
    return "|".join(pod.replace(".", "\\\\.") for pod in sorted(pods))


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


class TrialMetrics:
    def __init__(
        self, url: str, step_seconds: float, session: requests.Session | None = None
    ) -> None:
        problem = http_url_problem(url)
        if problem is not None:
            raise UserError(
                f"invalid Prometheus URL {without_credentials(url)!r}: {problem} "
                "(expected http://HOST:PORT)"
            )
        self.url = url.rstrip("/")
        self.step = step_seconds
        self._session = session or requests.Session()

    def close(self) -> None:
        self._session.close()

    def _range(
        self, query: str, start: float, end: float
    ) -> tuple[list[dict[str, str]], FloatMatrix]:
        points = max(1, math.floor((end - start) / self.step) + 1)
        grid = TimeGrid(start, self.step, points)
        try:
            answer = self._session.get(
                f"{self.url}/api/v1/query_range",
                params={
                    "query": query,
                    "start": f"{grid.start:.3f}",
                    "end": f"{grid.end:.3f}",
                    "step": f"{self.step:g}",
                },
                timeout=TIMEOUT_SECONDS,
            )
            document = answer.json()
        except (requests.RequestException, ValueError) as error:
            raise MetricsUnavailableError(
                f"Prometheus {without_credentials(self.url)}: {type(error).__name__}"
            ) from None
        if answer.status_code >= 400 and document.get("errorType") == "bad_data":
            raise UserError(f"Prometheus refused {query!r}: {document.get('error')}")
        try:
            result = matrix_result(document, f"the answer to {query!r}")
        except UserError as error:
            raise MetricsUnavailableError(str(error)) from None
        return align(result, grid)

    def check(self, expression: str) -> None:
        """Refuse, before anything is created, a PromQL expression Prometheus cannot parse."""
        query = expression.replace(POD_PLACEHOLDER, "no-pod")
        try:
            answer = self._session.get(
                f"{self.url}/api/v1/query", params={"query": query}, timeout=TIMEOUT_SECONDS
            )
            document = answer.json()
        except (requests.RequestException, ValueError) as error:
            raise UserError(
                f"cannot reach Prometheus {without_credentials(self.url)}: {type(error).__name__}"
            ) from None
        if document.get("status") != "success":
            raise UserError(f"--metric-query {expression!r}: {document.get('error')}")

    def user_rate(
        self, expression: str, pods: Sequence[str], start: float, end: float
    ) -> FloatArray:
        query = expression.replace(POD_PLACEHOLDER, pod_regex(pods))
        _labels, matrix = self._range(query, start, end)
        if matrix.shape[0] == 0:
            return np.empty(0)
        present = ~np.all(np.isnan(matrix), axis=0)
        total: FloatArray = np.nansum(matrix[:, present], axis=0)
        return total

    def _gpu_field(
        self, field: str, namespace: str, pods: Sequence[str], start: float, end: float
    ) -> FloatMatrix:
        selector = f'{field}{{namespace="{_escaped(namespace)}",pod=~"{pod_regex(pods)}"}}'
        _labels, matrix = self._range(selector, start, end)
        return matrix

    def utilisation(
        self, namespace: str, pods: Sequence[str], start: float, end: float
    ) -> FloatMatrix:
        """GPU utilisation, one row per GPU the pods hold."""
        return self._gpu_field(GPU_UTIL, namespace, pods, start, end)

    def sm_active(
        self, namespace: str, pods: Sequence[str], start: float, end: float
    ) -> FloatArray:
        matrix = self._gpu_field(SM_ACTIVE, namespace, pods, start, end)
        sampled = ~np.all(np.isnan(matrix), axis=0) if matrix.size else np.zeros(0, dtype=bool)
        if not sampled.any():
            return np.empty(0)
        mean: FloatArray = np.nanmean(matrix[:, sampled], axis=0)
        return mean

    def fb_peak_mib(
        self, namespace: str, pods: Sequence[str], start: float, end: float
    ) -> float | None:
        matrix = self._gpu_field(FB_USED, namespace, pods, start, end)
        if matrix.size == 0 or np.all(np.isnan(matrix)):
            return None
        return float(np.nanmax(matrix))
