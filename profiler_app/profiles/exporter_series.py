"""What each dcgm-exporter series says about a GPU and its pods, in every shape the exporter
sends (docs/sharing.md, "Exporter shapes"; upstream NVIDIA/dcgm-exporter,
internal/pkg/transformation/kubernetes.go):

- without ``KUBERNETES_VIRTUAL_GPUS``, every release: the device's series, labelled in place
  with the one pod that holds the GPU (``pod``, ``namespace``, ``container``; ``pod_uid``
  with pod UIDs on);
- with virtual GPUs, before 4.5.3-4.8.2: the device series of a GPU that holds pods is
  replaced, for every field, by one copy of the device's values per pod (``vgpu`` on a
  replica of a shared GPU);
- with virtual GPUs, 4.5.3-4.8.2 on: so for every field but ``DCGM_FI_DEV_GPU_UTIL`` and
  ``DCGM_FI_DEV_FB_USED``; those two keep the device series, without pod labels, beside one
  series per pod from NVML's per-process accounting, labelled ``pod_uid``. A pod whose
  processes the exporter cannot map reads 0 there, and without a pod UID (no access to the
  API server) every pod does.

The rules the profiles follow: the device's values are the GPU's time line; a pod is present
where any series of the GPU names it; a per-pod series is the pod's own measurement only where
it carries a non-empty ``pod_uid`` and the device series of the same GPU runs beside it (a copy
of the device's values, as before 4.5.3, has none beside it, whatever its labels); anything
else proves presence, never a peak.

The node label is ``Hostname`` up to 4.5.3-4.8.2 and ``hostname`` after (upstream commit
d5e5f51): either spelling is read as the configured one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from profiler_app.core.model import FB_USED, GPU_UTIL, SeriesMatrix
from profiler_app.profiles.timelines import KeyResolver

POD_UID_LABEL = "pod_uid"  # internal/pkg/transformation/const.go: uidAttribute
# internal/pkg/transformation/process_metrics.go: isPerProcessMetric
PER_PROCESS_FIELDS = frozenset({GPU_UTIL, FB_USED})
# internal/pkg/rendermetrics/render_metrics.go: "Hostname" to 4.5.3-4.8.2, "hostname" after.
NODE_LABELS = ("Hostname", "hostname")


def node_label_spellings(node_label: str) -> tuple[str, ...]:
    """The labels that may hold the node: both spellings of dcgm-exporter's, else the one given."""
    if node_label in NODE_LABELS:
        return (node_label, *(other for other in NODE_LABELS if other != node_label))
    return (node_label,)


def with_node_label(matrices: Sequence[SeriesMatrix], node_label: str) -> list[SeriesMatrix]:
    """``matrices`` with the node under ``node_label`` on every series that spells it the other
    way (``hostname`` for ``Hostname`` or the reverse)."""
    spellings = node_label_spellings(node_label)
    if len(spellings) == 1:
        return list(matrices)
    other = spellings[1]
    renamed = []
    for matrix in matrices:
        if not any(other in labels and node_label not in labels for labels in matrix.labels):
            renamed.append(matrix)
            continue
        labels = [
            {(node_label if name == other else name): value for name, value in series.items()}
            if node_label not in series
            else series
            for series in matrix.labels
        ]
        renamed.append(replace(matrix, labels=labels))
    return renamed


@dataclass(frozen=True)
class SplitField:
    """One field's series, apart: ``device`` holds the device's values (the GPU's time line;
    a per-pod sample is NaN there), ``presence`` the samples that only say a pod was there,
    ``own`` the pods' own measurements."""

    device: SeriesMatrix
    presence: SeriesMatrix | None
    own: SeriesMatrix | None


def _rows(matrix: SeriesMatrix, rows: list[int], values: np.ndarray) -> SeriesMatrix | None:
    if not rows:
        return None
    return replace(matrix, labels=[matrix.labels[row] for row in rows], values=values[rows])


def split_field(matrix: SeriesMatrix, resolver: KeyResolver) -> SplitField:
    """``matrix``'s series by what they say (the module's rules). Only GPU_UTIL and FB_USED
    have per-pod series; a pod-named sample of theirs is a pod's own where a series of the same
    GPU without a pod has a sample at the same time, and its value is then no device value."""
    if matrix.field not in PER_PROCESS_FIELDS or not matrix.labels:
        return SplitField(matrix, None, None)
    valid = np.isfinite(matrix.values)
    device_times: dict[tuple[str, str], np.ndarray] = {}
    for row, labels in enumerate(matrix.labels):
        if not labels.get("pod"):
            key = resolver.key(labels)
            seen = device_times.get(key)
            device_times[key] = valid[row] if seen is None else seen | valid[row]
    if not device_times:
        return SplitField(matrix, None, None)
    beside = np.zeros_like(valid)  # a pod's sample with the device's beside it
    for row, labels in enumerate(matrix.labels):
        times = device_times.get(resolver.key(labels))
        if labels.get("pod") and times is not None:
            beside[row] = valid[row] & times
    if not beside.any():
        return SplitField(matrix, None, None)
    per_pod = [row for row in range(len(matrix.labels)) if beside[row].any()]
    own = [row for row in per_pod if matrix.labels[row].get(POD_UID_LABEL)]
    present = np.where(beside, 1.0, np.nan)
    measured = np.where(beside, matrix.values, np.nan)
    remaining = np.where(beside, np.nan, matrix.values)
    # A pod's series keeps its samples without the device's beside it (a copy of the device's).
    kept = [
        row
        for row in range(len(matrix.labels))
        if not beside[row].any() or np.isfinite(remaining[row]).any()
    ]
    device = _rows(matrix, kept, remaining) or replace(matrix, labels=[], values=remaining[:0])
    return SplitField(device, _rows(matrix, per_pod, present), _rows(matrix, own, measured))
