"""dcgm-exporter-shaped metrics as OpenMetrics text, for backfilling a real Prometheus (a TEST
DOUBLE of NVIDIA/dcgm-exporter's /metrics).

Its shapes follow the exporter's source, read at the tags named (docs/sharing.md, "Upstream
versions read"):

- labels of a GPU's series: ``internal/pkg/rendermetrics/render_metrics.go`` at 4.5.3-4.8.2,
  lines 47-56 (``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``; ``pci_bus_id`` is
  left out, nothing here reads it); ``hostname`` on main after commit d5e5f51;
- pod labels: ``internal/pkg/transformation/kubernetes.go`` ``Process``, at 4.5.3-4.8.2
  (lines 331-451) and, before the per-process series, at 4.5.2-4.8.1 (lines 246-329, the same
  in 4.4.2-4.7.1); label names from ``const.go`` (``pod_uid``, ``vgpu``); which fields get
  per-pod series from ``process_metrics.go`` line 31 (GPU_UTIL and FB_USED).

``OpenMetricsBuilder`` writes any gauge or counter from numpy arrays with dcgm-exporter's labels
(``Gpu.labels``); ``node_series`` writes a node's GPUs and the pods holding them in each
``ExporterShape``; ``standard_dataset`` builds the labelled cluster that the ``prometheus``
fixture in tests/conftest.py serves: every node has one training, one inference, one idle and
one bursty GPU (more GPUs repeat the pattern), with the job types known in ``expected``.
Each busy GPU's pod also gets kubelet cAdvisor series (``add_cadvisor_pod``, a double of
kubelet's cAdvisor endpoint as kube-prometheus-stack scrapes it: see its docstring) whose CPU
and memory peaks are known in ``pod_peaks``.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, POWER_USAGE, SM_ACTIVE
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
    node_label: str = "Hostname"  # "hostname" after upstream commit d5e5f51

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
            self.node_label: self.hostname,
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
    over its containers only. ``scale`` makes pods differ.

    Labels as kubelet sets them (kubernetes/kubernetes ``pkg/kubelet/server/server.go``,
    ``containerPrometheusLabelsFunc``: ``namespace``, ``pod``, ``container``, the pod's own
    cgroup under the pod with an empty container; ``id``, ``name`` and ``image`` are left out,
    nothing here reads them) and as kube-prometheus-stack's kubelet ServiceMonitor adds them
    (prometheus-community/helm-charts ``charts/kube-prometheus-stack/values.yaml``,
    ``kubelet.serviceMonitor.cAdvisorRelabelings``: ``metrics_path``; prometheus-operator
    labels a target on a Node with ``node``)."""
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


@dataclass(frozen=True)
class ExporterShape:
    """How one dcgm-exporter deployment labels a node's series (module docstring's sources)."""

    name: str
    virtual_gpus: bool  # KUBERNETES_VIRTUAL_GPUS
    per_process: bool  # 4.5.3-4.8.2 on: per-pod GPU_UTIL and FB_USED beside the device's
    # The exporter reads pods from the API server (the chart mounts its token only with
    # enablePodUID or enablePodLabels) with pod UIDs on, and maps processes (hostPID).
    pod_uid: bool
    node_label: str = "Hostname"


EXPORTER_SHAPES = (
    ExporterShape("classic", virtual_gpus=False, per_process=True, pod_uid=False),
    ExporterShape("classic-pod-uid", virtual_gpus=False, per_process=True, pod_uid=True),
    ExporterShape("copies-before-4.5.3", virtual_gpus=True, per_process=False, pod_uid=False),
    ExporterShape(
        "copies-before-4.5.3-pod-uid", virtual_gpus=True, per_process=False, pod_uid=True
    ),
    ExporterShape("per-process", virtual_gpus=True, per_process=True, pod_uid=False),
    ExporterShape("per-process-pod-uid", virtual_gpus=True, per_process=True, pod_uid=True),
    ExporterShape(
        "per-process-pod-uid-hostname",
        virtual_gpus=True,
        per_process=True,
        pod_uid=True,
        node_label="hostname",
    ),
)
PER_PROCESS_FIELDS = (GPU_UTIL, FB_USED)  # process_metrics.go line 31


@dataclass(frozen=True)
class Holder:
    """A container holding a GPU in kubelet's pod resources: ``vgpu`` is the replica of a
    shared GPU (the ``::N`` of the device plugin's device id, kubernetes.go ``getSharedGPU``),
    ``own`` its processes' values by field (NVML's per-process accounting)."""

    namespace: str
    pod: str
    uid: str
    container: str = "main"
    vgpu: str | None = None
    own: dict[str, FloatArray] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeGpu:
    """A GPU of the node: its device values by field, and the containers holding it."""

    gpu: Gpu
    values: dict[str, FloatArray]
    holders: tuple[Holder, ...] = ()


Series = tuple[str, dict[str, str], FloatArray]  # field, labels, values


def _pod_labels(holder: Holder, uid: bool, vgpu: bool = True) -> dict[str, str]:
    labels = {"pod": holder.pod, "namespace": holder.namespace, "container": holder.container}
    if uid:  # an empty pod_uid is no label to Prometheus
        labels["pod_uid"] = holder.uid
    if vgpu and holder.vgpu is not None:
        labels["vgpu"] = holder.vgpu
    return labels


def node_series(shape: ExporterShape, gpus: Sequence[NodeGpu]) -> list[Series]:
    """Every series dcgm-exporter in ``shape`` sends for a node's GPUs, as
    ``internal/pkg/transformation/kubernetes.go`` ``Process`` builds them:

    - without virtual GPUs (4.5.3-4.8.2 lines 412-451): the device's series labelled in place
      with the GPU's pod, the last container listed (``toDeviceToPod`` keeps one per device,
      lines 887-909), no ``vgpu``; ``pod_uid`` with pod UIDs on (line 435);
    - virtual GPUs before 4.5.3 (4.5.2-4.8.1 lines 246-296): per holder a copy of the device's
      values, ``pod_uid`` always set but empty without UIDs (line 281), ``vgpu`` on a replica;
      once any GPU of the node has a holder, the series of GPUs without one are dropped (line
      292 keeps only the copies);
    - virtual GPUs 4.5.3-4.8.2 (lines 338-409): GPU_UTIL and FB_USED keep the device's series
      (line 366) beside one per holder from ``createPerProcessMetrics`` (lines 201-252:
      ``pod_uid`` always set, line 243), whose value is the holder's own or 0 when its
      processes are not mapped to it (``buildIdlePodValues``, lines 271-279), as every holder's
      is without pod UIDs; the other fields get a copy per holder (``pod_uid`` only with pod
      UIDs on, line 385); a GPU without holders keeps its device series (line 401).
    """
    any_held = any(gpu.holders for gpu in gpus)
    found: list[Series] = []
    for node_gpu in gpus:
        device = replace(node_gpu.gpu, node_label=shape.node_label).labels()
        for name, values in node_gpu.values.items():
            holders = node_gpu.holders
            if not shape.virtual_gpus:
                pod = _pod_labels(holders[-1], shape.pod_uid, vgpu=False) if holders else {}
                labels = device | pod
                found.append((name, labels, values))
                continue
            if not holders:
                if shape.per_process or not any_held:
                    found.append((name, device, values))
                continue
            if shape.per_process and name in PER_PROCESS_FIELDS:
                found.append((name, device, values))
                for holder in holders:
                    own = holder.own.get(name) if shape.pod_uid else None
                    measured = own if own is not None else np.zeros(values.size)
                    found.append((name, device | _pod_labels(holder, shape.pod_uid), measured))
                continue
            for holder in holders:
                found.append((name, device | _pod_labels(holder, shape.pod_uid), values))
    return found


# The mixed node: GPU 0 time-sliced by two pods (their own utilisation and framebuffer), GPU 1
# whole to a PyTorchJob's pod, GPU 2 empty.
SHARED_PODS = (("pod-a", "0", 60.0, 10_000.0), ("pod-b", "1", 20.0, 4_000.0))
TRAINER = "trainer-master-0"
MIXED_FIELDS = (GPU_UTIL, FB_USED, POWER_USAGE)


def mixed_node(
    shape: ExporterShape, node: str, times: FloatArray, *, seed: int = 29
) -> list[Series]:
    """The series of the mixed node (``SHARED_PODS``, ``TRAINER``, an empty GPU) in ``shape``."""
    rng = np.random.default_rng(seed)
    n = times.size

    def power(util: FloatArray) -> FloatArray:
        return np.round(70 + 630 * 0.75 * util / 100 + rng.normal(0, 5, n), 1)

    shared_util = np.rint(np.clip(80 + rng.normal(0, 1.5, n), 0, 100))
    holders = tuple(
        Holder(
            "ml",
            pod,
            f"uid-{pod}",
            vgpu=replica,
            own={GPU_UTIL: np.minimum(shared_util, util), FB_USED: np.full(n, fb)},
        )
        for pod, replica, util, fb in SHARED_PODS
    )
    train_util = np.rint(signals.square(n, 12, rng, duty=0.6, noise=3.0))
    train_fb = np.full(n, 30_000.0)
    trainer = Holder("ml", TRAINER, f"uid-{TRAINER}", own={GPU_UTIL: train_util, FB_USED: train_fb})
    idle = np.rint(signals.near_zero_noise(n, rng))
    gpus = [
        NodeGpu(
            Gpu(node, 0, model_name="NVIDIA L4"),
            {GPU_UTIL: shared_util, FB_USED: np.full(n, 14_000.0), POWER_USAGE: power(shared_util)},
            holders,
        ),
        NodeGpu(
            Gpu(node, 1),
            {GPU_UTIL: train_util, FB_USED: train_fb, POWER_USAGE: power(train_util)},
            (trainer,),
        ),
        NodeGpu(Gpu(node, 2), {GPU_UTIL: idle, FB_USED: np.zeros(n), POWER_USAGE: power(idle)}),
    ]
    return node_series(shape, gpus)


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
