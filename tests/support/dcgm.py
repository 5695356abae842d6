"""dcgm-exporter-shaped metrics as OpenMetrics text, for backfilling a real Prometheus.

``OpenMetricsBuilder`` writes any gauge or counter from numpy arrays with dcgm-exporter's labels
(``Gpu.labels``); ``standard_dataset`` builds the labelled cluster that the ``prometheus``
fixture in tests/conftest.py serves: every node has one training, one inference, one idle and
one bursty GPU (more GPUs repeat the pattern), with the job types known in ``expected``.
Each busy GPU's pod also gets kubelet cAdvisor series (``add_cadvisor_pod``) whose CPU and
memory peaks are known in ``pod_peaks``.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from profiler_app.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, POWER_USAGE, SM_ACTIVE
from tests.support import signals

FloatArray = npt.NDArray[np.float64]
STANDARD_FIELDS = (GPU_UTIL, MEM_COPY_UTIL, FB_USED, SM_ACTIVE, POWER_USAGE)
ROLES = (signals.TRAINING, signals.INFERENCE, signals.IDLE, signals.BURSTY)


@dataclass(frozen=True)
class Gpu:
    """One GPU as dcgm-exporter labels it; ``pod`` set means the GPU is attributed to a pod."""

    hostname: str
    index: int
    model_name: str = "NVIDIA H100 80GB HBM3"
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None

    @property
    def uuid(self) -> str:
        """A stable, realistic-looking UUID derived from host and index."""
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.hostname}/{self.index}')}"

    def labels(self) -> dict[str, str]:
        labels = {
            "gpu": str(self.index),
            "UUID": self.uuid,
            "device": f"nvidia{self.index}",
            "modelName": self.model_name,
            "Hostname": self.hostname,
        }
        for name, value in (("namespace", self.namespace), ("pod", self.pod)):
            if value is not None:
                labels[name] = value
        if self.container is not None:
            labels["container"] = self.container
        return labels


def sample_times(points: int, step_seconds: float, end: float | None = None) -> FloatArray:
    """``points`` timestamps ``step_seconds`` apart, the last one at ``end`` (default: now)."""
    last = math.floor(time.time() if end is None else end)
    return last - step_seconds * np.arange(points - 1, -1, -1, dtype=np.float64)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


@dataclass
class OpenMetricsBuilder:
    """Collects series by metric family and renders them as one OpenMetrics document.

    NaN values are left out (a missed scrape). Counters are written the OpenMetrics way:
    ``# TYPE name counter`` with samples named ``name_total`` (a trailing ``_total`` in the name
    given is not doubled).
    """

    _families: dict[str, tuple[str, list[str]]] = field(default_factory=dict)

    def add(
        self,
        metric: str,
        labels: dict[str, str],
        values: FloatArray,
        timestamps: FloatArray,
        kind: str = "gauge",
    ) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"unsupported metric type {kind!r}")
        if len(values) != len(timestamps):
            raise ValueError("values and timestamps differ in length")
        family = metric.removesuffix("_total") if kind == "counter" else metric
        sample_name = f"{family}_total" if kind == "counter" else metric
        known_kind, lines = self._families.setdefault(family, (kind, []))
        if known_kind != kind:
            raise ValueError(f"{family} was added as a {known_kind} before")
        label_text = ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items())
        prefix = f"{sample_name}{{{label_text}}} "
        lines.extend(
            f"{prefix}{_number(float(v))} {float(t):.3f}"
            for v, t in zip(values, timestamps, strict=True)
            if not math.isnan(v)
        )

    def text(self) -> str:
        parts = []
        for family, (kind, lines) in self._families.items():
            parts.append(f"# TYPE {family} {kind}")
            parts.extend(lines)
        parts.append("# EOF")
        return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Dataset:
    """A backfill document and what it contains."""

    openmetrics: str
    gpus: list[Gpu]
    fields: tuple[str, ...]
    start: float
    end: float
    step_seconds: float
    # (hostname, gpu index as a string) -> (job type, period in seconds or None)
    expected: dict[tuple[str, str], tuple[str, float | None]]
    # (node, namespace, pod) -> (CPU peak in percent of one core, memory peak in bytes)
    pod_peaks: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return sorted({gpu.hostname for gpu in self.gpus})


# A cAdvisor pod's CPU and memory burst: [end - 20 min, end - 12 min), long past the 2 min rate
# window, so the peak of rate() over any window that still holds it is the burst rate exactly.
CADVISOR_BURST = (20 * 60.0, 12 * 60.0)
_MIB = 2.0**20


def add_cadvisor_pod(
    builder: OpenMetricsBuilder,
    node: str,
    namespace: str,
    pod: str,
    times: FloatArray,
    *,
    scale: int = 0,
) -> tuple[float, float]:
    """kubelet cAdvisor series of a pod with containers ``main`` and ``sidecar``, plus the
    pod-level (``container=""``) and pause (``container="POD"``) rows a real kubelet also
    exports; returns the pod's (CPU peak in percent of one core, memory peak in bytes) summed
    over its containers only. ``scale`` makes pods differ."""
    step = float(times[1] - times[0]) if times.size > 1 else 1.0
    burst = (times >= times[-1] - CADVISOR_BURST[0]) & (times < times[-1] - CADVISOR_BURST[1])
    cores = {
        "main": 0.5 + burst * (1.0 + 0.25 * scale),
        "sidecar": np.full(times.size, 0.1),
        "POD": np.full(times.size, 0.001),
    }
    memory = {
        "main": 1024 * _MIB + burst * (2048 + 128 * scale) * _MIB,
        "sidecar": np.full(times.size, 64 * _MIB),
        "POD": np.full(times.size, 1 * _MIB),
    }
    cores[""] = cores["main"] + cores["sidecar"] + cores["POD"]
    memory[""] = memory["main"] + memory["sidecar"] + memory["POD"]
    for container in ("main", "sidecar", "POD", ""):
        labels = {
            "namespace": namespace,
            "pod": pod,
            "container": container,
            "node": node,
            "job": "kubelet",
            "metrics_path": "/metrics/cadvisor",
        }
        counter = np.cumsum(cores[container] * step)
        builder.add("container_cpu_usage_seconds_total", labels, counter, times, kind="counter")
        builder.add("container_memory_working_set_bytes", labels, memory[container], times)
    cpu_peak = (0.5 + 1.0 + 0.25 * scale + 0.1) * 100
    memory_peak = (1024 + 2048 + 128 * scale + 64) * _MIB
    return cpu_peak, memory_peak


def _utilisation(role: str, n: int, period: int, rng: np.random.Generator) -> FloatArray:
    if role == signals.TRAINING:
        return signals.square(n, period, rng, duty=0.6, noise=3.0)
    if role == signals.INFERENCE:
        return signals.steady_serving(n, rng)
    if role == signals.BURSTY:
        # A few bursts in every 30 minutes (180 samples at 10 s), so any window sees some.
        segment = max(30, n // max(1, round(n / 180)))
        pieces = [
            signals.sporadic_bursts(min(segment, n - first), rng, bursts=3, shortest=2, longest=9)
            for first in range(0, n, segment)
        ]
        return np.concatenate(pieces)
    return signals.near_zero_noise(n, rng)


_FB_USED_MIB = {
    signals.TRAINING: 61_000.0,
    signals.INFERENCE: 23_000.0,
    signals.BURSTY: 9_000.0,
    signals.IDLE: 0.0,
}


def _fields_for(role: str, util: FloatArray, rng: np.random.Generator) -> dict[str, FloatArray]:
    """dcgm-exporter's other fields, consistent with the GPU's utilisation."""
    busy = util > 5
    copy = np.clip(np.rint(0.45 * util + rng.normal(0, 1.5, util.size)), 0, 100)
    fb = np.where(busy | (role in (signals.TRAINING, signals.INFERENCE)), _FB_USED_MIB[role], 0.0)
    return {
        GPU_UTIL: np.rint(util),
        MEM_COPY_UTIL: copy,
        FB_USED: fb + np.rint(rng.normal(0, 40, util.size)).clip(0) * (fb > 0),
        SM_ACTIVE: np.round(np.clip(util / 100 * 0.9, 0, 1), 3),
        # An H100 (the default model): 70 W idle, up to 75 % of its 700 W range with the work.
        POWER_USAGE: np.round(70 + 630 * 0.75 * util / 100 + rng.normal(0, 5, util.size), 1),
    }


def standard_dataset(
    nodes: int = 3,
    gpus_per_node: int = 4,
    hours: float = 6.0,
    step_seconds: float = 10.0,
    *,
    fields: Sequence[str] = STANDARD_FIELDS,
    end: float | None = None,
    seed: int = 20261122,
    hostname: Callable[[int], str] = lambda number: f"gpu-node-{number}",
    cadvisor: bool = True,
) -> Dataset:
    """``nodes`` x ``gpus_per_node`` GPUs over ``hours`` ending at ``end`` (default: now).

    GPU ``j`` of node ``i`` (both from 0) plays role ``ROLES[(i + j) % 4]``; training periods are
    90, 120 or 180 s by node. Busy GPUs carry pod labels (namespace ``ml``, pod
    ``<role>-<node>-<gpu>``, container ``main``); idle ones none, as dcgm-exporter does.
    With ``cadvisor``, each such pod also gets kubelet cAdvisor series (``add_cadvisor_pod``).
    """
    rng = np.random.default_rng(seed)
    points = round(hours * 3600 / step_seconds)
    times = sample_times(points, step_seconds, end)
    builder = OpenMetricsBuilder()
    gpus, expected = [], {}
    pod_peaks: dict[tuple[str, str, str], tuple[float, float]] = {}
    for node_number in range(nodes):
        host = hostname(node_number + 1)
        period = (9, 12, 18)[node_number % 3]
        for index in range(gpus_per_node):
            role = ROLES[(node_number + index) % len(ROLES)]
            pod = None if role == signals.IDLE else f"{role}-{node_number + 1}-{index}"
            gpu = Gpu(
                host,
                index,
                namespace=pod and "ml",
                pod=pod,
                container=pod and "main",
            )
            gpus.append(gpu)
            is_training = role == signals.TRAINING
            expected[(host, str(index))] = (role, period * step_seconds if is_training else None)
            per_field = _fields_for(role, _utilisation(role, points, period, rng), rng)
            for name in fields:
                builder.add(name, gpu.labels(), per_field[name], times)
            if cadvisor and pod is not None:
                pod_peaks[host, "ml", pod] = add_cadvisor_pod(
                    builder, host, "ml", pod, times, scale=index
                )
    return Dataset(
        builder.text(),
        gpus,
        tuple(fields),
        float(times[0]),
        float(times[-1]),
        step_seconds,
        expected,
        pod_peaks,
    )
