"""One GPU, one time line: every series of a GPU within the window merged into one row,
whatever labels changed (an exporter restarted under a new ``instance``, the GPU handed to
another pod, any new label).

A GPU is identified by (node, UUID, MIG instance): dcgm-exporter labels every MIG instance with
its parent's UUID and ``gpu`` index and adds ``GPU_I_ID`` (empty or absent for a whole GPU), so
the instances of one GPU stay apart. The ``gpu`` index is the fallback for series without a
UUID, and such a series joins the UUID of the same node, index and instance when exactly one is
known.
Where series of one GPU overlap (the same sample scraped twice), the larger reading wins.
Which pod held the GPU becomes an attribute over time: the pod of the latest sample, and every
pod seen with its share of the GPU's samples.

A GPU shared by time-slicing (docs/sharing.md) has a series per pod at the same times: with
dcgm-exporter's ``KUBERNETES_VIRTUAL_GPUS`` a copy of the device's values per pod, labelled
``vgpu`` on a replica, and from 4.5.3-4.8.2 on per-pod series of GPU_UTIL and FB_USED beside
the device's (``exporter_series``: they only say where a pod was, passed as ``presence``). Such
a GPU is ``shared``: its copies merge into the one device time line, and every pod counts with
the share of the samples it was present in, not only the one that started last.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from profiler_app.core.arrays import distinct
from profiler_app.core.model import FloatMatrix, PodShare, SeriesMatrix, mig_instance

# (node, "uuid:<UUID>") or, without a UUID, (node, "gpu:<index>"); a MIG instance's key adds
# "/mig:<GPU_I_ID>".
GpuKey = tuple[str, str]
Pod = tuple[str, str]  # (namespace, pod)
VGPU_LABEL = "vgpu"  # dcgm-exporter's replica of a shared GPU (KUBERNETES_VIRTUAL_GPUS)
# Distinct pods sampled at the same time on this share of a GPU's samples (and at least
# CONCURRENT_MIN_SAMPLES): the GPU is shared, not handed over (a handover overlaps a sample or two).
CONCURRENT_SHARE = 0.1
CONCURRENT_MIN_SAMPLES = 3


def gpu_key(labels: dict[str, str], node_label: str) -> GpuKey:
    node = labels.get(node_label, "")
    uuid = labels.get("UUID", "")
    device = f"uuid:{uuid}" if uuid else f"gpu:{labels.get('gpu', '')}"
    instance = mig_instance(labels)
    return (node, f"{device}/mig:{instance}") if instance else (node, device)


def _pod(labels: dict[str, str]) -> Pod | None:
    pod = labels.get("pod")
    return (labels.get("namespace", ""), pod) if pod else None


class KeyResolver:
    """Maps series labels to GPU keys; an index-only key joins the one UUID known for it."""

    def __init__(self, labels: Sequence[dict[str, str]], node_label: str) -> None:
        self.node_label = node_label
        by_index: dict[tuple[str, str, str], set[GpuKey]] = defaultdict(set)
        for series in labels:
            key = gpu_key(series, node_label)
            if key[1].startswith("uuid:"):
                by_index[key[0], series.get("gpu", ""), mig_instance(series)].add(key)
        self._unique = {
            index: next(iter(keys)) for index, keys in by_index.items() if len(keys) == 1
        }

    def key(self, labels: dict[str, str]) -> GpuKey:
        key = gpu_key(labels, self.node_label)
        if key[1].startswith("gpu:"):
            index = (key[0], labels.get("gpu", ""), mig_instance(labels))
            return self._unique.get(index, key)
        return key


@dataclass(frozen=True)
class Timelines:
    """One row per GPU of one field, in order of first appearance."""

    keys: list[GpuKey]
    labels: list[dict[str, str]]  # the labels of each GPU's latest series
    values: FloatMatrix
    current: list[Pod | None]  # the pod of each GPU's latest sample
    pods: list[tuple[PodShare, ...]]  # every pod seen, largest share first
    last: list[int]  # column of each GPU's latest sample (-1: none)
    shared: list[bool]  # several pods at once (time-slicing): see the module's docstring


def _groups(keys: Sequence[GpuKey]) -> dict[GpuKey, list[int]]:
    groups: dict[GpuKey, list[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return groups


def _last_valid(valid: np.ndarray) -> np.ndarray:
    """Index of each row's last valid column (-1 for none)."""
    columns = valid.shape[1]
    last = columns - 1 - np.argmax(valid[:, ::-1], axis=1)
    return np.where(valid.any(axis=1), last, -1)


def _concurrent(pods: list[Pod | None], valid: np.ndarray) -> bool:
    """Whether distinct pods have samples at the same times, on enough of them to be sharing."""
    named = sorted({pod for pod in pods if pod is not None})
    if len(named) < 2:
        return False
    per_pod = np.vstack(
        [np.any(valid[[row for row, p in enumerate(pods) if p == pod]], axis=0) for pod in named]
    )
    together = int(np.count_nonzero(per_pod.sum(axis=0) >= 2))
    covered = int(np.count_nonzero(valid.any(axis=0)))
    return together >= max(CONCURRENT_MIN_SAMPLES, CONCURRENT_SHARE * covered)


def _shared_attribution(
    pods: list[Pod | None], valid: np.ndarray, timestamps: np.ndarray
) -> tuple[Pod | None, tuple[PodShare, ...]]:
    """Every pod of a shared GPU with the share of the GPU's samples it was present in; the
    current pod is the one present at the latest sample that started last."""
    covered = np.flatnonzero(valid.any(axis=0))
    if covered.size == 0:
        return None, ()
    spans = []
    for pod in sorted({pod for pod in pods if pod is not None}):
        present = np.flatnonzero(
            np.any(valid[[row for row, p in enumerate(pods) if p == pod]], axis=0)
        )
        spans.append((pod, present))
    shares = sorted(spans, key=lambda item: (-item[1].size, -int(item[1][-1])))
    at_last = [(int(present[0]), pod) for pod, present in spans if present[-1] == covered[-1]]
    current = max(at_last)[1] if at_last else None
    return current, tuple(
        PodShare(
            pod[0],
            pod[1],
            present.size / covered.size,
            float(timestamps[present[0]]),
            float(timestamps[present[-1]]),
        )
        for pod, present in shares
    )


def _attribution(
    pods: list[Pod | None], valid: np.ndarray, timestamps: np.ndarray
) -> tuple[Pod | None, tuple[PodShare, ...]]:
    """The current pod and each pod's share of the samples, with its first and last sample
    time, for one GPU's series (rows of ``valid``).

    A column belongs to the series that started last among those with a sample there (the
    new owner of a handed-over GPU, the new exporter after a restart), a series naming a pod
    before one that names none (the device's series beside its pod's).
    """
    present = valid.any(axis=1)
    if not present.any():
        return None, ()
    owner = np.full(valid.shape[1], -1)
    if valid.shape[0] == 1:
        owner[valid[0]] = 0
    else:
        first = np.where(present, np.argmax(valid, axis=1), valid.shape[1])
        named = np.array([pod is not None for pod in pods])
        for series in np.lexsort((first, named)).tolist():
            owner[valid[series]] = series
    covered = np.flatnonzero(owner >= 0)
    held = owner[covered]
    spans: dict[Pod, tuple[int, int, int]] = {}  # columns held, first and last column
    for series in distinct(held).tolist():
        pod = pods[series]
        if pod is None:
            continue
        columns = covered[held == series]
        count, first, last = spans.get(pod, (0, columns[0], columns[-1]))
        spans[pod] = (count + columns.size, min(first, columns[0]), max(last, columns[-1]))
    shares = sorted(spans.items(), key=lambda item: (-item[1][0], -item[1][2]))
    current = pods[int(owner[covered[-1]])]
    return current, tuple(
        PodShare(
            namespace,
            pod,
            count / covered.size,
            float(timestamps[first]),
            float(timestamps[last]),
        )
        for (namespace, pod), (count, first, last) in shares
    )


def merge(
    matrix: SeriesMatrix, resolver: KeyResolver, presence: SeriesMatrix | None = None
) -> Timelines:
    """The GPUs of one field: one merged row each, with the labels of its latest series.
    ``presence`` (on ``matrix``'s grid): series that only say which pod was on a GPU when; they
    count for the pods, not for the values."""
    groups = _groups([resolver.key(labels) for labels in matrix.labels])
    keys = list(groups)
    valid = np.isfinite(matrix.values)
    last = _last_valid(valid) if matrix.values.size else np.full(len(matrix.labels), -1)
    present_rows = _groups([resolver.key(labels) for labels in presence.labels]) if presence else {}
    present = np.isfinite(presence.values) if presence else np.zeros((0, valid.shape[1]), bool)
    if all(len(rows) == 1 for rows in groups.values()):
        values = matrix.values
    else:
        values = np.vstack(
            [np.fmax.reduce(matrix.values[rows], axis=0) for rows in groups.values()]
        )
    labels: list[dict[str, str]] = []
    current: list[Pod | None] = []
    pods: list[tuple[PodShare, ...]] = []
    latest_columns: list[int] = []
    shared: list[bool] = []
    for key, rows in groups.items():
        # The latest series: the one with the latest sample; on a tie, the later in the answer.
        latest = max(rows, key=lambda row: (last[row], row))
        latest_columns.append(int(last[latest]))
        labels.append(dict(matrix.labels[latest]))
        extra = present_rows.get(key, [])
        series = [matrix.labels[row] for row in rows]
        series += [presence.labels[row] for row in extra] if presence else []
        series_pods = [_pod(one) for one in series]
        seen = np.vstack([valid[rows], present[extra]]) if extra else valid[rows]
        sharing = any(VGPU_LABEL in one for one in series) or _concurrent(series_pods, seen)
        attribute = _shared_attribution if sharing else _attribution
        now, shares = attribute(series_pods, seen, matrix.timestamps)
        current.append(now)
        pods.append(shares)
        shared.append(sharing)
    return Timelines(keys, labels, values, current, pods, latest_columns, shared)


def _held(values: FloatMatrix, source: np.ndarray, target: np.ndarray) -> FloatMatrix:
    """``values`` at ``source`` times (a coarser grid than ``target``) on every ``target``
    point: the nearest source sample, within half a source step (NaN beyond)."""
    moved = np.full((values.shape[0], target.size), np.nan)
    step = float(source[1] - source[0])
    after = np.clip(np.searchsorted(source, target), 1, source.size - 1)
    before = after - 1
    nearest = np.where(target - source[before] <= source[after] - target, before, after)
    close = np.abs(source[nearest] - target) <= step / 2 + 1e-9
    moved[:, close] = values[:, nearest[close]]
    return moved


def on_grid(values: FloatMatrix, source: np.ndarray, target: np.ndarray) -> FloatMatrix:
    """``values`` sampled at ``source`` times, moved onto the ``target`` grid (nearest point of
    an evenly spaced grid; NaN where nothing lands). A coarser field (power read once a second
    beside utilisation at 0.1 s, local sampling) holds each sample over its own step."""
    if source.shape == target.shape and np.allclose(source, target):
        return values
    moved = np.full((values.shape[0], target.size), np.nan)
    if target.size == 0:
        return moved
    step = float(target[1] - target[0]) if target.size > 1 else 1.0
    if source.size > 1 and float(source[1] - source[0]) > 1.5 * step:
        return _held(values, source, target)
    columns = np.rint((source - target[0]) / step).astype(np.int64)
    inside = (columns >= 0) & (columns < target.size)
    moved[:, columns[inside]] = values[:, inside]
    return moved


def align(
    other: SeriesMatrix, keys: Sequence[GpuKey], resolver: KeyResolver, timestamps: np.ndarray
) -> tuple[FloatMatrix, np.ndarray]:
    """``other``'s rows for the GPUs ``keys`` on the ``timestamps`` grid (series of one GPU
    merged), and which GPUs have any series of it."""
    rows = np.full((len(keys), timestamps.size), np.nan)
    present = np.zeros(len(keys), dtype=bool)
    if not other.labels:
        return rows, present
    position = {key: index for index, key in enumerate(keys)}
    values = on_grid(other.values, other.timestamps, timestamps)
    for key, series in _groups([resolver.key(labels) for labels in other.labels]).items():
        index = position.get(key)
        if index is None:
            continue
        rows[index] = values[series[0]] if len(series) == 1 else np.fmax.reduce(values[series], 0)
        present[index] = True
    return rows, present
