"""What a stand-in GPU cluster looks like: ``Scenario()`` is healthy, as the stacks deploy it; each
field away from its default breaks it in one way (see tests/smoke/test_standin_cluster.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.gpu import GPU_TAINT_EFFECT, GPU_TAINT_KEY, GPU_TAINT_VALUE

Json = dict[str, Any]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"

    def manifest(self) -> Json:
        return {"key": self.key, "value": self.value, "effect": self.effect}


GPU_TAINT = Taint(GPU_TAINT_KEY, GPU_TAINT_VALUE, GPU_TAINT_EFFECT)


@dataclass(frozen=True)
class GpuNode:
    """A GPU node: ``gpus`` GPUs as NVML (dcgm-exporter, nvidia-smi) sees them."""

    name: str
    gpus: int = 2
    model: str = "NVIDIA A10G"
    labelled: bool = True  # nvidia.com/gpu.present=true
    taints: tuple[Taint, ...] = (GPU_TAINT,)
    unhealthy_gpus: int = 0  # GPUs the device plugin holds back from allocatable
    busy_gpus: int = 0  # GPUs a production pod holds from the start (allocatable, not free)
    instance_type: str | None = None  # node.kubernetes.io/instance-type (p5.48xlarge: NVSwitch)
    # MIG devices per GPU (profile names; empty: a whole GPU): the device plugin runs migStrategy
    # mixed on the node (sharing.py).
    mig: tuple[tuple[str, ...], ...] = ()
    # Time-slicing: each GPU offered this many times as nvidia.com/gpu.shared (0: not shared).
    time_slicing_replicas: int = 0


@dataclass(frozen=True)
class Unready:
    """A workload's pod that never gets ready: on ``node``, or wherever it was scheduled."""

    workload: str
    reason: str
    message: str
    node: str | None = None


@dataclass(frozen=True)
class Karpenter:
    """A stand-in Karpenter with one GPU NodePool (see karpenter.py); the defaults are healthy.

    ``launch_failure`` (reason, message): every NodeClaim fails to launch and stays
    ``Launched=Unknown`` with them (an EC2NodeClass without subnets, say; on insufficient
    capacity the real controller deletes the NodeClaim instead). ``consolidates`` False: empty
    nodes are never removed, as with ``consolidateAfter: Never`` or a disruption budget of zero.
    """

    gpus_per_node: int = 1
    launch_seconds: float = 0.3  # from NodeClaim to a registered, initialised node
    consolidate_after_seconds: float = 0.5  # how long a node stays empty before it goes
    launch_failure: tuple[str, str] | None = None
    consolidates: bool = True
    # False: it serves its objects and runs its controller but launches nothing (the full-suite
    # cases, whose pending GPU pods must stay pending; the scaling cases launch).
    launches: bool = True
    # (reason, message) of a NodePool or EC2NodeClass whose Ready condition is False.
    node_pool_not_ready: tuple[str, str] | None = None
    node_class_not_ready: tuple[str, str] | None = None


@dataclass(frozen=True)
class Keda:
    """KEDA's operator and metrics server, and the example workload's ScaledObject."""

    scaled_object_not_ready: tuple[str, str] | None = None  # (reason, message) of Ready=False
    active: str = "False"  # the Active condition: an idle workload's trigger is not active


@dataclass(frozen=True)
class Storage:
    """Block storage: the default StorageClass, and whether its provisioner creates volumes."""

    default_class: str | None = "gp3-encrypted"
    provisions: bool = True


@dataclass(frozen=True)
class StoreDatabase:
    """The profiler's database (a CloudNativePG cluster) and whether the profiler's writes fail."""

    healthy: bool = True
    failing_writes: bool = False


@dataclass(frozen=True)
class TrainingModel:
    """What a training container (a command with ``train`` in it) does, by placement: a step
    takes ``compute_seconds`` (divided by its GPU model's ``speed``) plus ring all-reduce's
    share ``(K - 1) / K`` of ``node_sync_seconds`` within one node or ``net_sync_seconds``
    across nodes, with a deterministic jitter of ``jitter`` (relative). Each step prints
    ``step=N loss=L samples_per_sec=S`` (Katib's format; S for ``batch_per_gpu`` per GPU).
    Trials on a GPU count in ``failing`` exit 1 after three steps; on one in ``hanging`` they
    run without printing a step. Deleted, a training container exits ``stop_seconds`` after
    SIGTERM; with a preStop hook it takes its whole grace period (the hook runs first)."""

    compute_seconds: float = 0.2
    node_sync_seconds: float = 0.02
    net_sync_seconds: float = 0.3
    speed: tuple[tuple[str, float], ...] = ()
    batch_per_gpu: int = 32
    jitter: float = 0.01
    failing: tuple[int, ...] = ()
    hanging: tuple[int, ...] = ()
    stop_seconds: float = 2.0

    def step_seconds(self, gpus: int, nodes: int, model: str) -> float:
        speed = dict(self.speed).get(model, 1.0)
        share = (gpus - 1) / gpus
        sync = self.node_sync_seconds if nodes <= 1 else self.net_sync_seconds
        return self.compute_seconds / speed + share * sync


@dataclass(frozen=True)
class Scenario:
    gpu_nodes: tuple[GpuNode, ...] = (
        GpuNode("gpu-node-1"),
        # An NVSwitch instance type (in this model with 2 GPUs): its GPUs must copy peer to peer.
        GpuNode("gpu-node-2", instance_type="p5.48xlarge"),
    )
    # CPU nodes for Prometheus, Grafana, the operator and the adapter, which tolerate no taint.
    system_nodes: tuple[str, ...] = ("system-node-1",)
    unready: tuple[Unready, ...] = ()
    dcgm_series: bool = True  # False: dcgm-exporter answers scrapes, but with no DCGM field
    profile_age_seconds: float = 60.0  # age of profiled-at where the profiler runs
    grafana_admin_password: str = "pulumi-generated-5f0c2a9d7e1b"
    # True: the NVIDIA runtime hands every GPU to a container that sets NVIDIA_VISIBLE_DEVICES,
    # whether or not the pod requested GPUs (the toolkit's default for unprivileged pods).
    runtime_honours_visible_devices_env: bool = False
    # True: dcgm-exporter names a pod on the next GPU of its node, not on the one it holds (the
    # device plugin's IDs mapped to GPUs in another order than NVML's).
    misattributed: bool = False
    row_remap_failures: tuple[tuple[str, int], ...] = ()  # (node, GPU index): a failed GPU
    node_port_services: tuple[str, ...] = ()  # "namespace/name" of extra NodePort Services
    # GPU feature discovery labels nodes with nvidia.com/gpu.product where the device plugin runs
    # (the stacks turn it on); False: only node.kubernetes.io/instance-type names the model.
    gfd: bool = True
    training: TrainingModel = TrainingModel()
    # None: no Karpenter (the karpenter.sh API is not served), as with keda, store.
    karpenter: Karpenter | None = field(default_factory=lambda: Karpenter(launches=False))
    keda: Keda | None = field(default_factory=Keda)
    storage: Storage = field(default_factory=Storage)
    store: StoreDatabase | None = field(default_factory=StoreDatabase)
    # CUDA on the GPUs (the stand-in driver of tests/support/fake_libcuda.c): a driver call that
    # fails with a CUresult, e.g. ("cuLaunchKernel", 802): the device is visible, the kernel fails
    # (Fabric Manager down); False peer_access: GPUs cannot reach each other (NVLink down).
    cuda_failure: tuple[str, int] | None = None
    peer_access: bool = True
    # Test pods whose container the runtime cannot start: (pod name, reason, message).
    start_failures: tuple[tuple[str, str, str], ...] = ()
    # True: a container given one MIG device sees every MIG device of its GPU (sharing.py).
    mig_devices_leak: bool = False
    # True: GFD labels say time-slicing, but the device plugin offers each GPU once.
    sharing_not_applied: bool = False
