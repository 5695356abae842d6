"""The data that flows from sources through analysis to sinks.

Sources produce ``SeriesMatrix`` objects (one per metric field); ``profiles.build.build_profiles``
classifies them into ``GpuProfile`` objects; a cycle's ``CycleResult`` goes to every sink.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # types only: numpy takes 50 ms to load, and the commands that only read
    # the store (report) never touch an array
    import numpy as np
    import numpy.typing as npt

FloatMatrix: TypeAlias = "npt.NDArray[np.float64]"


class Prior(StrEnum):
    """What the workload of a GPU says it runs: its owner (``profiles.workloads``) or the engine
    in its command (``profiles.engines``)."""

    TRAINING = "training"
    SERVING = "serving"


@dataclass(frozen=True)
class Identity:
    """What a GPU's workload runs, as far as its command, image or libraries tell."""

    engine: str | None = None  # a name of profiles.engines.ENGINE_NAMES
    framework: str | None = None  # a name of profiles.engines.FRAMEWORK_NAMES
    role: Prior | None = None  # the engine's

    @property
    def reason(self) -> str:
        """``engine vllm (serving)``, or "" when the engine has no role."""
        return f"engine {self.engine} ({self.role})" if self.engine and self.role else ""

    def merged(self, other: Identity | None) -> Identity:
        """This identity, its gaps filled from ``other``."""
        if other is None:
            return self
        if self.engine:
            return Identity(self.engine, self.framework or other.framework, self.role)
        return Identity(other.engine, self.framework or other.framework, other.role)


# dcgm-exporter field names used across the project.
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
POWER_MGMT_LIMIT = "DCGM_FI_DEV_POWER_MGMT_LIMIT"
ENFORCED_POWER_LIMIT = "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"
PROF_PREFIX = "DCGM_FI_PROF_"  # DCGM's profiling fields: ratios (0-1)

# dcgm-exporter's labels of a MIG instance: its GPU instance id (absent or '' on a whole GPU)
# and profile (e.g. 1g.10gb). Every instance also carries its parent's UUID and gpu index.
MIG_INSTANCE_LABEL = "GPU_I_ID"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"

# How a GPU is shared (GpuProfile.sharing, the store's ``sharing``): the device plugin's
# strategies. Which series are a pod's own share of a GPU: ``exporter_series``.
NOT_SHARED, TIME_SLICING, MPS = "none", "time-slicing", "mps"

# A GPU holding at least this much framebuffer holds memory for a workload (a CUDA context
# alone takes a few hundred MiB): an idle one is "memory held, compute idle".
HELD_MEMORY_MIB = 1024.0


def mig_instance(labels: Mapping[str, str]) -> str:
    """A series' MIG GPU instance id ('' for a whole GPU)."""
    return labels.get(MIG_INSTANCE_LABEL, "")


@dataclass(frozen=True)
class SeriesMatrix:
    """One metric field for a set of series on a common time grid.

    ``values[i, j]`` is series ``i`` (labels ``labels[i]``) at ``timestamps[j]``; NaN marks a
    missing sample. Timestamps are Unix seconds, evenly spaced by ``step_seconds``.
    """

    field: str
    labels: list[dict[str, str]]
    timestamps: npt.NDArray[np.float64]
    values: FloatMatrix
    step_seconds: float


@dataclass(frozen=True)
class FieldStats:
    """Summary statistics of one series over the window (NaN samples ignored)."""

    max: float
    p95: float
    mean: float
    idle_fraction: float


@dataclass(frozen=True)
class PodShare:
    """A pod seen on a GPU within the window, the share of the GPU's samples it held, and the
    times of its first and last sample there."""

    namespace: str
    pod: str
    share: float  # 0-1
    first_seen: float | None = None  # Unix seconds
    last_seen: float | None = None


@dataclass(frozen=True)
class PodGpuPeak:
    """A pod's own peaks on a GPU, from the per-pod series dcgm-exporter derives from NVML's
    per-process accounting (labelled ``pod_uid``; docs/sharing.md). None: not in them."""

    namespace: str
    pod: str
    util_max: float | None  # percent of the GPU
    fb_used_max_mib: float | None


@dataclass(frozen=True)
class GpuProfile:
    """What one GPU did over the window: exactly one per GPU, whatever its labels did."""

    gpu: str  # index on the node, dcgm-exporter's ``gpu`` label (the latest one seen)
    uuid: str
    hostname: str
    job_type: str
    period_seconds: float | None
    stats: dict[str, FieldStats]  # by field name
    labels: dict[str, str] = field(default_factory=dict)  # labels of the GPU's latest series
    namespace: str | None = None  # the current pod (of the latest sample), if any
    pod: str | None = None
    confidence: float | None = None  # 0-1, see docs/analysis.md
    reasons: tuple[str, ...] = ()  # machine-readable evidence, e.g. "period 80s in power"
    basis: str | None = None  # what the verdict rests on (analysis.Basis.label), e.g. "waiting"
    pods: tuple[PodShare, ...] = ()  # every pod seen in the window, largest share first
    owner_kind: str | None = None  # the workload the pod belongs to, e.g. PyTorchJob
    owner_name: str | None = None
    # Unix seconds of the GPU's first sample in the window: later than the window's start when
    # the node (or its exporter, or local sampling) started within it.
    first_sample: float | None = None
    engine: str | None = (
        None  # what runs on it (profiler_app.profiles.engines), e.g. vllm, torchrun
    )
    framework: str | None = None  # e.g. pytorch, jax
    # A MIG instance: dcgm-exporter's GPU_I_ID and GPU_I_PROFILE ('' for a whole GPU). Its
    # utilisation is GR_ENGINE_ACTIVE and its memory bandwidth DRAM_ACTIVE, relative to the
    # instance (``util_field``/``mem_field``; docs/sharing.md).
    mig_instance: str = ""
    mig_profile: str = ""
    gpu_model: str = ""  # dcgm-exporter's modelName
    util_field: str = GPU_UTIL
    mem_field: str = MEM_COPY_UTIL
    # How the GPU is shared: none, time-slicing or mps (None: not known), and in how many
    # replicas where known (docs/sharing.md).
    sharing: str | None = None
    replicas: int | None = None
    # On a shared GPU, each pod's own peaks where per-pod series exist (else nothing: a pod's
    # share of a shared GPU is then not attributable, never the whole GPU's figures).
    pod_peaks: tuple[PodGpuPeak, ...] = ()

    @property
    def device(self) -> str:
        """The GPU's index, with a MIG instance's id: ``0``, ``0-mig-3``."""
        return f"{self.gpu}-mig-{self.mig_instance}" if self.mig_instance else self.gpu


def stats_of(profile: GpuProfile, field: str) -> FieldStats | None:
    """``profile``'s statistics of ``field``; GPU utilisation and memory bandwidth from the
    fields that stand for them on this GPU (on a MIG instance GR_ENGINE_ACTIVE and DRAM_ACTIVE,
    ratios read in percent)."""
    source = {GPU_UTIL: profile.util_field, MEM_COPY_UTIL: profile.mem_field}.get(field, field)
    stats = profile.stats.get(source)
    if stats is None or source == field or not source.startswith(PROF_PREFIX):
        return stats
    return FieldStats(stats.max * 100, stats.p95 * 100, stats.mean * 100, stats.idle_fraction)


@dataclass(frozen=True)
class PodPeak:
    """A pod's peaks within the window (None where its cgroup does not account for it)."""

    cpu_util_max: float | None  # percent of one core
    mem_used_max_bytes: float | None


# A pod's disk and network directions, as IoRates and PodIoSeries name them.
DISK_READ, DISK_WRITE = "disk_read", "disk_write"
NETWORK_RECEIVE, NETWORK_TRANSMIT = "network_receive", "network_transmit"
IO_FIELDS = (DISK_READ, DISK_WRITE, NETWORK_RECEIVE, NETWORK_TRANSMIT)
NETWORK_FIELDS = (NETWORK_RECEIVE, NETWORK_TRANSMIT)


@dataclass(frozen=True)
class PodIoSeries:
    """A pod's disk and network rates (bytes per second) over the window on one time grid.

    ``rates`` holds the directions (``IO_FIELDS``) that were measured, each as long as
    ``timestamps`` (NaN: no reading then). ``network_attributable`` False says the pod's
    network cannot be told from the host's (local mode, a pod on the host's network), so the
    network directions are left out rather than guessed.
    """

    timestamps: npt.NDArray[np.float64]
    rates: Mapping[str, npt.NDArray[np.float64]]
    network_attributable: bool = True


@dataclass(frozen=True)
class RateStats:
    """Peak and 95th percentile of one rate over the window."""

    max: float
    p95: float


@dataclass(frozen=True)
class IoRates:
    """A pod's disk and network rates over the window, bytes per second, by ``IO_FIELDS``
    name; a direction absent was not measured (or, for the network, not attributable)."""

    stats: Mapping[str, RateStats]
    network_attributable: bool = True

    def stat(self, direction: str, which: str) -> float | None:
        """``which`` ("max" or "p95") of ``direction``, None where not measured."""
        stats = self.stats.get(direction)
        return None if stats is None else float(getattr(stats, which))


@dataclass(frozen=True)
class PodUsage:
    """Peak resource use of one pod that uses GPUs, as far as this node can see it."""

    namespace: str
    pod: str
    node: str
    start_time: datetime | None
    gpus: tuple[str, ...]
    gpu_util_max: float | None = None
    gpu_mem_copy_util_max: float | None = None  # DCGM_FI_DEV_MEM_COPY_UTIL, percent
    fb_used_max_mib: float | None = None
    cpu_util_max: float | None = None  # percent of one core
    mem_used_max_bytes: float | None = None
    # When the pod's GPUs were first and last seen with it in the window (None: not on a GPU's
    # series, e.g. a pod holding GPUs it does not use; the cycle's time stands in).
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    owner_kind: str | None = None  # the workload, e.g. PyTorchJob, Deployment
    owner_name: str | None = None
    # Where its GPU peaks come from on a shared (time-sliced) GPU: SHARED_PER_POD (its own
    # series) or SHARED_NOT_ATTRIBUTABLE (none: its GPU peaks are left unknown). None: its GPUs
    # are its own.
    gpu_attribution: str | None = None
    io: IoRates | None = None  # disk and network rates; None where nothing measured them


SHARED_PER_POD = "shared: per pod"
SHARED_NOT_ATTRIBUTABLE = "shared: not attributable"


@dataclass(frozen=True)
class PodInfo:
    """What the profiler knows of one pod on this node, as Kubernetes lists it (the pod
    watcher, ``sources.kube_pods``)."""

    uid: str
    namespace: str
    name: str
    node: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    start_time: datetime | None
    # GPU devices the pod requests, of every GPU resource (gpu_resources), init containers
    # included as scheduled
    gpu_requests: int
    gpu_limits: int
    container_ids: Mapping[str, str]  # runtime container id (no "containerd://" prefix) -> name
    # The controller in the pod's ownerReferences ("" for a bare pod), and the pod's labels
    # that name its workload (workloads.WORKLOAD_LABEL_KEYS): the classifier's prior.
    owner_kind: str = ""
    owner_name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    # The few annotations the watcher was asked to keep (do-not-disrupt and the profiler's
    # marker, with --protect-training); not the others.
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The engine and framework its containers declare (image, command, args): decided when the
    # pod is read, so its command line (which may carry tokens) is never kept.
    identity: Identity | None = None
    # On the host's network (spec.hostNetwork): its network counters are the node's, not its own.
    host_network: bool = False

    @property
    def uses_gpus(self) -> bool:
        return max(self.gpu_requests, self.gpu_limits) > 0

    @property
    def finished(self) -> bool:
        """Its containers have stopped: it holds no GPU any more, whatever its spec requested."""
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class CycleResult:
    """Everything one profiling cycle found, handed to every sink."""

    node: str
    at: datetime
    window_seconds: float
    gpus: list[GpuProfile]
    pods: list[PodUsage] = field(default_factory=list)
    host: dict[str, float] = field(default_factory=dict)  # cpu/memory/disk/network utilisation
    # The pods Kubernetes lists on this node (the watcher's view when the cycle read); None
    # when Kubernetes is off or its first list has not come: then no sink acts on a pod.
    node_pods: tuple[PodInfo, ...] | None = None
    # False when the GPU series could not be read (gpus is then empty, not "no GPU trains"):
    # only sinks that act on the pod list alone get such a result (protection by owner).
    gpus_read: bool = True
