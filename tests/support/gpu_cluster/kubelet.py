"""Pods created through the stand-in API server (the smoke suite's test pods, and the pods of Jobs
and PyTorchJobs): admission (ResourceQuota, PriorityClass), then the scheduler binds each at
creation, or when a node joins (``bind_pending``), honouring required pod affinity and topology
spread over hostnames; the device plugin allocates its GPUs; the kubelet starts it after a
moment and, by the container model of objects.run_container, lets it finish or keep running.

A training container (see scenario.TrainingModel) prints a step line per iteration of the
period its pod group's placement gives (the GPUs and nodes of the pods sharing its controller),
from when the whole group runs; its log is made on request, up to the cluster's clock.

Deletion is graceful, as kube-apiserver 1.35 and the kubelet do it: a bound pod that has not
ended gets ``metadata.deletionTimestamp`` (now plus its grace period: the DELETE's
``gracePeriodSeconds``, else its ``terminationGracePeriodSeconds``, else 30) and stays, Terminating,
with its GPUs allocated and counted by the quota, until its containers exit (a training container
after ``TrainingModel.stop_seconds``, one with a preStop hook at the end of the grace period,
other containers at once) or the grace period ends; a second DELETE may only shorten it. An
unbound or ended pod, or a grace period of 0, is removed at once (kubernetes@v1.35.0
pkg/registry/core/pod/strategy.go ``CheckGracefulDelete``; pkg/kubelet/kuberuntime
kuberuntime_container.go ``killContainer``).

Delays run on the cluster's clock (``tick``, called by a ticker thread and before every request),
so a fake clock moves pods only when a test moves it."""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.support.apiserver.objects import status_object
from tests.support.clock import rfc3339_nano
from tests.support.gpu_cluster import objects, sharing
from tests.support.gpu_cluster.controllers import DEVICE_PLUGIN
from tests.support.gpu_cluster.objects import Json
from tests.support.gpu_cluster.scenario import GpuNode

if TYPE_CHECKING:
    from tests.support.gpu_cluster.apiserver import StandInGpuCluster

DEFAULT_GRACE_SECONDS = 30  # the API's default terminationGracePeriodSeconds
KUBELET_DELAY_SECONDS = 0.1  # from bound to started, and from started to finished
Reply = tuple[int, Any]
PodKey = tuple[str, str]


@dataclass(frozen=True)
class Allocation:
    node: GpuNode
    gpus: list[int]
    shared: list[sharing.Device] = field(default_factory=list)  # MIG devices, shared GPUs


def not_found(kind: str, name: str) -> Reply:
    return 404, status_object(404, "NotFound", f'{kind} "{name}" not found')


class PodLifecycle:
    """Test pods of ``cluster``, from creation to deletion. Callers hold ``cluster.lock``
    except where a method says it takes it."""

    def __init__(self, cluster: StandInGpuCluster) -> None:
        self._cluster = cluster
        self._allocations: dict[PodKey, Allocation] = {}
        self._logs: dict[PodKey, str] = {}
        self._started: dict[PodKey, float] = {}  # training containers: when they started
        self._due: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []
        self._unbound: set[PodKey] = set()  # created here, left Pending by the scheduler
        self.claims: dict[PodKey, Json] = {}  # PersistentVolumeClaims, by (namespace, name)

    def stop(self) -> None:
        self._due.clear()

    def tick(self) -> None:
        """Run the delayed actions that are due on the cluster's clock (takes the lock)."""
        with self._cluster.lock:
            now = self._cluster.clock()
            due = [item for item in self._due if item[0] <= now]
            self._due = [item for item in self._due if item[0] > now]
        for _when, action, args in sorted(due, key=lambda item: item[0]):
            action(*args)

    def holders(self) -> dict[tuple[str, int], PodKey]:
        """(node, GPU index) -> the running pod the device plugin gave that GPU to."""
        pods = self._cluster.state.pods
        return {
            (allocation.node.name, index): key
            for key, allocation in self._allocations.items()
            if pods.get(key, {}).get("status", {}).get("phase") == "Running"
            for index in allocation.gpus
        }

    def create(self, namespace: str, manifest: Json) -> Reply:
        pods = self._cluster.state.pods
        name = manifest.get("metadata", {}).get("name")
        if namespace not in self._cluster.namespaces:
            return not_found("namespaces", namespace)
        if not name:
            return 422, status_object(422, "Invalid", "metadata.name: Required value")
        if (namespace, name) in pods:
            return 409, status_object(409, "AlreadyExists", f'pods "{name}" already exists')
        problem = objects.invalid_pod(manifest.get("spec", {}).get("containers") or [])
        if problem:
            return 422, status_object(422, "Invalid", f'Pod "{name}" is invalid: {problem}')
        refusal = self._cluster.batch.admit_pod(namespace, manifest)
        if refusal:
            return 403, status_object(403, "Forbidden", f'pods "{name}" is forbidden: {refusal}')
        pod = copy.deepcopy(manifest)
        pod["metadata"] |= {
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": objects.now_rfc3339(now=self._cluster.clock()),
        }
        pod["status"] = self._schedule((namespace, name), pod)
        if not pod["spec"].get("nodeName"):
            self._unbound.add((namespace, name))
        self._cluster.commit("pods", (namespace, name), pod, event="ADDED")
        return 201, copy.deepcopy(pod)

    def create_claim(self, namespace: str, manifest: Json) -> Reply:
        """A PersistentVolumeClaim: Pending until a pod that uses it is scheduled
        (WaitForFirstConsumer), then Bound if the storage provisions it."""
        name = manifest.get("metadata", {}).get("name")
        if namespace not in self._cluster.namespaces:
            return not_found("namespaces", namespace)
        if (namespace, name) in self.claims:
            return 409, status_object(
                409, "AlreadyExists", f'persistentvolumeclaims "{name}" exists'
            )
        claim = copy.deepcopy(manifest)
        claim["metadata"] |= {"namespace": namespace, "uid": str(uuid.uuid4())}
        claim["status"] = {"phase": "Pending"}
        self.claims[namespace, name] = claim
        return 201, copy.deepcopy(claim)

    def claim_events(self, namespace: str) -> list[Json]:
        """The provisioner's warnings about the namespace's claims that could not bind."""
        storage = self._cluster.scenario.storage
        failure = "rpc error: code = Internal desc = Could not create volume: UnauthorizedOperation"
        return [
            {
                "type": "Warning",
                "reason": "ProvisioningFailed",
                "message": f"failed to provision volume with StorageClass "
                f'"{claim["spec"].get("storageClassName")}": {failure}',
                "involvedObject": {"kind": "PersistentVolumeClaim", "name": name},
            }
            for (ns, name), claim in self.claims.items()
            if ns == namespace
            and claim["status"]["phase"] == "Pending"
            and claim.get("wanted")
            and not storage.provisions
        ]

    def _volume_problem(self, key: PodKey, spec: Json) -> str | None:
        """Why the pod's claims cannot be bound (None: bound now, or no claims)."""
        storage = self._cluster.scenario.storage
        for volume in spec.get("volumes") or []:
            claim_name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim_name:
                continue
            claim = self.claims.get((key[0], claim_name))
            if claim is None:
                return f'persistentvolumeclaim "{claim_name}" not found'
            claim["wanted"] = True
            class_name = claim["spec"].get("storageClassName")
            if not storage.provisions or class_name != storage.default_class:
                return (
                    'running PreBind plugin "VolumeBinding": binding volumes: provisioning failed '
                    f'for PVC "{claim_name}"'
                )
            claim["status"] = {"phase": "Bound"}
        return None

    def bind_pending(self) -> None:
        """The scheduler's retry when a node joins: bind the pods it left Pending, if they fit."""
        for key in sorted(self._unbound):
            stored = self._cluster.state.pods.get(key)
            if stored is None:
                self._unbound.discard(key)
                continue
            pod = copy.deepcopy(stored)
            pod["status"] = self._schedule(key, pod)
            if pod["spec"].get("nodeName"):
                self._unbound.discard(key)
            self._cluster.commit("pods", key, pod, event="MODIFIED")

    def delete(self, key: PodKey, grace: int | None = None) -> Reply:
        """Delete gracefully (see the module docstring); the pod as the DELETE answers it."""
        pod = self._cluster.state.pods.get(key)
        if pod is None:
            return not_found("pods", key[1])
        spec, metadata = pod.get("spec") or {}, pod["metadata"]
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        ended = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if grace <= 0 or ended or not spec.get("nodeName"):
            return self._remove(key)
        now = self._cluster.clock()
        until = now + grace
        stamped = objects.parse_rfc3339(metadata.get("deletionTimestamp") or "")
        if stamped is not None and stamped <= until:
            return 200, copy.deepcopy(pod)  # already Terminating, no later than this
        terminating = copy.deepcopy(pod)
        terminating["metadata"] |= {
            "deletionTimestamp": objects.now_rfc3339(now=until),
            "deletionGracePeriodSeconds": grace,
        }
        self._cluster.commit("pods", key, terminating, event="MODIFIED")
        self._later(min(grace, self._stop_seconds(pod)), self._exit, key, metadata.get("uid"))
        return 200, copy.deepcopy(terminating)

    def _stop_seconds(self, pod: Json) -> float:
        """How long the pod's containers take to exit after SIGTERM."""
        containers = pod["spec"].get("containers") or []
        if any("preStop" in (c.get("lifecycle") or {}) for c in containers):
            return float("inf")  # the hook holds the pod to the end of its grace period
        if any(objects.TRAINING_COMMAND.search(objects.command_line(c)) for c in containers):
            return self._cluster.scenario.training.stop_seconds
        return 0.0

    def _exit(self, key: PodKey, uid: str | None) -> None:
        """The containers exited (or the grace period ended): the pod is gone (takes the lock)."""
        with self._cluster.lock:
            pod = self._cluster.state.pods.get(key)
            if pod is not None and pod["metadata"].get("uid") == uid:
                self._remove(key)

    def _remove(self, key: PodKey) -> Reply:
        pod = self._cluster.state.pods[key]
        self._cluster.commit("pods", key, pod, event="DELETED")
        self._unbound.discard(key)
        self._allocations.pop(key, None)
        self._logs.pop(key, None)
        self._started.pop(key, None)
        return 200, copy.deepcopy(pod)

    def log(self, key: PodKey, *, timestamps: bool = False, since: float | None = None) -> Reply:
        if key not in self._cluster.state.pods:
            return not_found("pods", key[1])
        if key not in self._logs:
            message = f'container "main" in pod "{key[1]}" is waiting to start'
            return 400, status_object(400, "BadRequest", message)
        lines = [(self._started.get(key, 0.0), line) for line in self._logs[key].splitlines()]
        lines += self._training_lines(key)
        kept = [(t, line) for t, line in lines if since is None or t >= since]
        if timestamps:
            return 200, "".join(f"{rfc3339_nano(t)} {line}\n" for t, line in kept)
        return 200, "".join(f"{line}\n" for _t, line in kept)

    def group(self, key: PodKey) -> list[PodKey]:
        """The pods sharing ``key``'s controller (itself alone without one)."""
        pods = self._cluster.state.pods
        owners = pods.get(key, {}).get("metadata", {}).get("ownerReferences") or []
        if not owners:
            return [key]
        uid = owners[0].get("uid")
        return sorted(
            other
            for other, pod in pods.items()
            if any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or [])
        )

    def step_period(self, key: PodKey) -> tuple[float, float] | None:
        """(when the group's last pod started, step seconds) once every pod of a training
        group runs; None before, or for other containers."""
        members = self.group(key)
        if not all(member in self._started for member in members):
            return None
        expected = self._cluster.batch.expected_pods(members)
        if len(members) < expected:
            return None
        allocations = [self._allocations[m] for m in members if m in self._allocations]
        gpus = sum(len(a.gpus) for a in allocations)
        if not allocations or not gpus:
            return None
        nodes = len({a.node.name for a in allocations})
        model = self._cluster.scenario.training
        period = model.step_seconds(gpus, nodes, allocations[0].node.model)
        return max(self._started[m] for m in members), period

    def _training_lines(self, key: PodKey) -> list[tuple[float, str]]:
        pod = self._cluster.state.pods[key]
        container = pod["spec"]["containers"][0]
        model = self._cluster.scenario.training
        shape = self.step_period(key) if key in self._started else None
        if not objects.TRAINING_COMMAND.search(objects.command_line(container)) or shape is None:
            return []
        start, period = shape
        gpus = sum(
            len(self._allocations[m].gpus) for m in self.group(key) if m in self._allocations
        )
        if gpus in model.hanging:
            return []
        now = self._cluster.clock()
        lines, moment, step = [], start, 0
        while True:
            step += 1
            jitter = _jitter(f"{key}/{step}", model.jitter)
            moment += period * (1.0 + jitter)
            if moment > now:
                return lines
            rate = gpus * model.batch_per_gpu / period
            loss = 2.0 / (1 + 0.01 * step)
            lines.append((moment, f"step={step} loss={loss:.4f} samples_per_sec={rate:.2f}"))

    def _free_gpus(self, node: GpuNode) -> list[int]:
        pods = self._cluster.state.pods
        if not objects.ready_pod_of(list(pods.values()), DEVICE_PLUGIN, node.name):
            return []
        taken_by_production = set(range(node.busy_gpus))
        taken = {
            index
            for key, allocation in self._allocations.items()
            if allocation.node is node
            and pods.get(key, {}).get("status", {}).get("phase") in ("Pending", "Running")
            for index in allocation.gpus
        }
        return [
            index
            for index in sharing.whole_gpus(node)
            if index not in taken and index not in taken_by_production
        ]

    def _free_shared(self, node: GpuNode) -> list[sharing.Device]:
        """MIG devices and shared GPU replicas the device plugin can still hand out."""
        pods = self._cluster.state.pods
        if not objects.ready_pod_of(list(pods.values()), DEVICE_PLUGIN, node.name):
            return []
        taken = {
            device
            for key, allocation in self._allocations.items()
            if allocation.node is node
            and pods.get(key, {}).get("status", {}).get("phase") in ("Pending", "Running")
            for device in allocation.shared
        }
        return [d for d in sharing.devices(node, self._cluster.scenario) if d not in taken]

    def _schedule(self, key: PodKey, pod: Json) -> Json:
        """Bind the pod (setting spec.nodeName) and return its status, or leave it Pending."""
        spec = pod["spec"]
        volume_problem = self._volume_problem(key, spec)
        if volume_problem is not None:
            return {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "SchedulerError",
                        "message": volume_problem,
                    }
                ],
            }
        nodes = sorted(self._cluster.state.nodes.items())
        placed = [
            other
            for (namespace, _), other in self._cluster.state.pods.items()
            if namespace == key[0]
            and other["spec"].get("nodeName")
            and other.get("status", {}).get("phase") in ("Pending", "Running")
        ]
        domains = [
            name for name, node in nodes if objects.misfit(node, spec, free_gpus=1 << 20) is None
        ]
        reasons = []
        for name, node in nodes:
            gpu_node = self._cluster.gpu_nodes.get(name)
            free = self._free_gpus(gpu_node) if gpu_node else []
            shared = self._free_shared(gpu_node) if gpu_node else []
            reason = objects.misfit(
                node, spec, free_gpus=len(free), free_shared=sharing.free_counts(shared)
            ) or objects.layout_misfit(name, pod, placed, domains)
            if reason:
                reasons.append(reason)
                continue
            spec["nodeName"] = name
            if gpu_node is not None:
                self._allocations[key] = Allocation(
                    gpu_node,
                    free[: objects.gpus_requested(spec)],
                    sharing.allocate(shared, sharing.requested(spec)),
                )
            self._later(KUBELET_DELAY_SECONDS, self._start, key)
            container = spec["containers"][0]["name"]
            waiting = {"waiting": {"reason": "ContainerCreating"}}
            return {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [
                    {"name": container, "ready": False, "restartCount": 0, "state": waiting}
                ],
            }
        message = objects.unschedulable_message(reasons)
        return {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        }

    def _later(self, delay: float, action: Callable[..., None], *args: Any) -> None:
        self._due.append((self._cluster.clock() + delay, action, args))

    def _start(self, key: PodKey) -> None:
        """The kubelet starts the container (takes the lock)."""
        with self._cluster.lock:
            pod = self._cluster.state.pods.get(key)
            if pod is None:
                return
            scenario = self._cluster.scenario
            container = pod["spec"]["containers"][0]
            failure = next((f for f in scenario.start_failures if f[0] == key[1]), None)
            if failure is not None:  # the runtime could not start it: no log, exit 128
                ended = {
                    "terminated": {"exitCode": 128, "reason": failure[1], "message": failure[2]}
                }
                self._set_state(key, "Failed", ended, ready=False)
                return
            node = self._cluster.gpu_nodes.get(pod["spec"]["nodeName"])
            visible = None
            allocation = self._allocations.get(key)
            if node is not None:
                allocated = [objects.gpu(node, i) for i in (allocation.gpus if allocation else [])]
                visible = objects.visible_gpus(scenario, node, container, allocated)
            listing = None
            if node is not None and allocation is not None and allocation.shared:
                listing = sharing.nvidia_smi_listing(
                    node, allocation.shared, scenario, lambda index: objects.gpu(node, index).uuid
                )
        # The program runs outside the lock: the stand-in driver takes a moment.
        log, exit_code = objects.run_container(container, visible, scenario, listing)
        with self._cluster.lock:
            if key not in self._cluster.state.pods:
                return
            self._logs[key] = log
            now = self._cluster.clock()
            self._started[key] = now
            running = {"running": {"startedAt": objects.now_rfc3339(now=now)}}
            self._set_state(key, "Running", running, ready=True)
            delay = KUBELET_DELAY_SECONDS
            failing = self._cluster.scenario.training.failing
            if objects.TRAINING_COMMAND.search(objects.command_line(container)) and (
                allocation is not None and len(allocation.gpus) * len(self.group(key)) in failing
            ):
                exit_code, delay = 1, 3 * self._cluster.scenario.training.compute_seconds
        if exit_code is not None:
            reason = "Completed" if exit_code == 0 else "Error"
            ended = {"terminated": {"exitCode": exit_code, "reason": reason}}
            status = "Succeeded" if exit_code == 0 else "Failed"
            self._later(delay, self._finish, key, status, ended)

    def _finish(self, key: PodKey, phase: str, state: Json) -> None:
        """The container exits (takes the lock)."""
        with self._cluster.lock:
            if key in self._cluster.state.pods:
                self._set_state(key, phase, state, ready=False)

    def _set_state(self, key: PodKey, phase: str, state: Json, *, ready: bool) -> None:
        pod = copy.deepcopy(self._cluster.state.pods[key])
        pod["status"]["phase"] = phase
        pod["status"]["containerStatuses"][0] |= {"state": state, "ready": ready}
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": str(ready)},
        ]
        self._cluster.commit("pods", key, pod, event="MODIFIED")


def _jitter(seed: str, amplitude: float) -> float:
    """A deterministic value in [-amplitude, amplitude)."""
    digest = int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16)
    return (digest / 0xFFFFFFFF * 2 - 1) * amplitude
