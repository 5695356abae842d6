"""Prometheus answers as data: checking ``query_range`` and instant-query documents, aligning
their series onto a time grid, and writing matrices back as documents (for saved dumps)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from profiler_app.core.arrays import distinct
from profiler_app.core.errors import UserError
from profiler_app.core.model import FloatMatrix, SeriesMatrix
from profiler_app.sources.prometheus.grid import FloatArray, TimeGrid

MAX_INFERRED_POINTS = 1_000_000  # a saved document whose timestamps imply more is not a range query


def matrix_result(document: object, origin: str) -> list[dict[str, object]]:
    """The ``data.result`` list of a successful matrix document, checked item by item."""
    problem = f"{origin} is not a Prometheus query_range document"
    return _result(document, problem, "matrix", _is_series, "{metric, values} series")


def vector_result(document: object, origin: str) -> list[dict[str, object]]:
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
    if isinstance(document, dict) and document.get("status") == "error":
        # Prometheus's own words (errorType bad_data, "parse error at ...") say what went wrong.
        kind = document.get("errorType")
        text = document.get("error") or "no error text"
        said = f"{kind}: {text}" if kind else str(text)
        raise UserError(f"{problem}: Prometheus answered an error: {said}")
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


def series_arrays(item: dict[str, object]) -> tuple[FloatArray, FloatArray]:
    pairs: list[list[object]] = item["values"]  # type: ignore[assignment]
    try:
        times = np.array([pair[0] for pair in pairs], dtype=np.float64)
        values = np.array([pair[1] for pair in pairs], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise UserError(f"malformed sample in a query_range series: {error}") from error
    return times, values


def align(
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
        times, values = series_arrays(item)
        placed.append((rows[key], times, values))
    matrix = np.full((len(labels), grid.points), np.nan)
    for row, times, values in placed:
        columns = np.rint((times - grid.start) / grid.step).astype(np.int64)
        inside = (columns >= 0) & (columns < grid.points)
        matrix[row, columns[inside]] = values[inside]
    return labels, matrix


def fields_in_document(document: object, origin: str = "the document") -> list[str]:
    """Distinct ``__name__`` labels of a query_range document, in order of appearance."""
    names: dict[str, None] = {}
    for item in matrix_result(document, origin):
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
        for item in matrix_result(document, origin)
        if item["metric"].get("__name__", field) == field  # type: ignore[attr-defined]
    ]
    if not selected:
        raise UserError(f"{origin} has no {field} series")
    times = distinct(np.concatenate([series_arrays(item)[0] for item in selected]))
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
    labels, values = align(selected, grid)
    return SeriesMatrix(field, labels, grid.timestamps(), values, step)


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
