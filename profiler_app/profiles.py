"""Per-GPU profiles from metric matrices: the primary field classified, the others summarised.

One ``GpuProfile`` per series of the primary field (a GPU handed from one pod to another within
the window has one series per pod, so one profile per pod). Other fields are joined to it by
their labels: the same label set first, else the same (node, gpu, UUID, namespace, pod), else
the same (node, gpu, UUID) when that is unambiguous. Several matching series of one field (e.g.
the GPU scraped twice) are merged sample by sample with their maximum.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from profiler_app.analysis import classify_matrix, field_stats
from profiler_app.model import GPU_UTIL, FieldStats, FloatMatrix, GpuProfile, SeriesMatrix

Key = tuple[str, ...]


def _keys(labels: dict[str, str], node_label: str) -> tuple[Key, Key, Key]:
    """Join keys from the most to the least specific."""
    gpu = (labels.get(node_label, ""), labels.get("gpu", ""), labels.get("UUID", ""))
    exact = tuple(f"{name}={value}" for name, value in sorted(labels.items()))
    return exact, (*gpu, labels.get("namespace", ""), labels.get("pod", "")), gpu


def _join(
    primary: SeriesMatrix, other: SeriesMatrix, node_label: str
) -> tuple[list[int], FloatMatrix]:
    """Indexes of ``primary`` rows that have a match in ``other``, and one merged row each."""
    index: list[dict[Key, list[int]]] = [defaultdict(list) for _ in range(3)]
    for row, labels in enumerate(other.labels):
        for level, key in enumerate(_keys(labels, node_label)):
            index[level][key].append(row)
    matched: list[int] = []
    rows: list[FloatMatrix] = []
    for position, labels in enumerate(primary.labels):
        for level, key in enumerate(_keys(labels, node_label)):
            found = index[level].get(key)
            if found and (level < 2 or len({other.labels[r].get("pod") for r in found}) == 1):
                matched.append(position)
                rows.append(np.fmax.reduce(other.values[found], axis=0))
                break
    width = other.values.shape[1] if other.values.ndim == 2 else 0
    return matched, np.array(rows).reshape(len(rows), width)


def _gpu_order(profile: GpuProfile) -> tuple[str, int, int | str, str, str]:
    numeric = profile.gpu.isdigit()
    return (
        profile.hostname,
        0 if numeric else 1,
        int(profile.gpu) if numeric else profile.gpu,
        profile.namespace or "",
        profile.pod or "",
    )


def build_profiles(
    matrices: Sequence[SeriesMatrix],
    primary_field: str = GPU_UTIL,
    node_label: str = "Hostname",
) -> list[GpuProfile]:
    """Classify ``primary_field``'s series and attach statistics of every field to each GPU.

    Raises ``ValueError`` when no matrix holds ``primary_field``.
    """
    primary = next((matrix for matrix in matrices if matrix.field == primary_field), None)
    if primary is None:
        raise ValueError(f"no {primary_field} matrix among {[m.field for m in matrices]}")
    if not primary.labels:
        return []
    results = classify_matrix(primary.values, primary.step_seconds)
    stats: list[dict[str, FieldStats]] = [{primary.field: result.stats} for result in results]
    for other in matrices:
        if other is primary or not other.labels:
            continue
        positions, rows = _join(primary, other, node_label)
        if not positions:
            continue
        for position, summary in zip(positions, field_stats(rows), strict=True):
            stats[position][other.field] = summary
    profiles = [
        GpuProfile(
            gpu=labels.get("gpu", ""),
            uuid=labels.get("UUID", ""),
            hostname=labels.get(node_label, ""),
            job_type=str(result.job_type),
            period_seconds=result.period_seconds,
            stats=per_field,
            labels=dict(labels),
            namespace=labels.get("namespace") or None,
            pod=labels.get("pod") or None,
        )
        for labels, result, per_field in zip(primary.labels, results, stats, strict=True)
    ]
    return sorted(profiles, key=_gpu_order)
