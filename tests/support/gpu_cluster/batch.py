"""Jobs, Kubeflow PyTorchJobs, ConfigMaps, ResourceQuotas and PriorityClasses of the stand-in GPU
cluster: a TEST DOUBLE of their API and controllers, as far as ``gpu-profiler trial`` uses them.

Modelled as the real ones behave:

- Job controller (batch/v1): one pod per Job (``parallelism`` 1), named ``<job>-<suffix>``,
  labelled ``job-name``/``controller-uid`` and owned by the Job. ``status.startTime`` when the
  Job is first synced; ``activeDeadlineSeconds`` counts from it on the cluster's clock, and past
  it the running pods are deleted and the Job fails with ``DeadlineExceeded``; a failed pod with
  ``backoffLimit: 0`` fails it with ``BackoffLimitExceeded``; a succeeded one completes it;
  ``ttlSecondsAfterFinished`` after it finished, the Job is deleted with its pods. A failing Job
  first gets the condition ``FailureTarget`` (its active pods deleted), and ``Failed`` only once
  no pod of it is left running (kubernetes@v1.35.0 pkg/controller/job: ``newFailureCondition``
  makes ``FailureTarget`` when ``delayTerminalCondition()``, which the default feature gates
  turn on).
- Training operator (kubeflow.org/v1 PyTorchJob): pods ``<job>-master-0`` and ``<job>-worker-N``
  labelled ``training.kubeflow.org/*`` and owned by the job; a container named ``pytorch`` is
  required (the operator's validation, 422); ``runPolicy`` gives the deadline, back-off limit,
  time to live and ``cleanPodPolicy`` (``All``: every pod deleted once the job ends). It
  succeeds when its master (else worker 0) succeeds, fails when any pod fails.
- A pod its controller could not create (refused by a quota) is created again on a later sync,
  and the refusal is recorded as a Warning Event ``FailedCreate`` "Error creating: <the API
  server's message>" on the Job or PyTorchJob, repeated ones counted in the same Event
  (kubernetes@v1.35.0 pkg/controller/controller_utils.go ``CreatePods``,
  ``FailedCreatePodReason``; client-go's event correlator aggregates repeats).
- Admission of pods: a ResourceQuota's ``requests.nvidia.com/gpu`` and ``pods`` (over the
  namespace's pods that have not ended: Pending and Running, Terminating ones included until
  they are gone) and ``count/pods`` (over every pod stored, ended ones too), as
  kubernetes@v1.35.0 pkg/quota/v1/evaluator/core/pods.go ``PodUsageFunc`` charges them; an
  existing ``priorityClassName``; else 403 as the real admission plugins answer. Object counts
  (``count/jobs.batch``, ...) at creation.
- A new ResourceQuota is enforced only once the quota controller has filled its ``status``
  (``QUOTA_SYNC_SECONDS`` after its creation, on the cluster's clock); before, every create it
  covers gets 403 "status unknown for quota: NAME, resources: R" (k8s.io/apiserver@v0.35.0
  pkg/admission/plugin/resourcequota/controller.go ``checkRequest``).
- Leases (coordination.k8s.io/v1) and any kind above replaced by PUT: a ``resourceVersion``
  other than the stored one is 409 Conflict, as the registry's optimistic concurrency answers;
  each stored change gets a new one.
- Garbage collection by owner references: deleting an object with ``propagationPolicy``
  ``Background`` or ``Foreground`` deletes its dependents, recursively; ``Orphan`` leaves them
  without the reference. A Job deleted with no policy orphans its pods (batch/v1's default over
  the REST API, unlike kubectl's); other kinds default to ``Background``.

Everything created through the API is recorded (``created``), with the most GPUs the pods of
each namespace held at once (``peak_gpus``), so tests can check that nothing is left behind and
that a quota held. Not modelled: label selectors other than equality, watches of these kinds,
Job parallelism, indexed completions, gang scheduling.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.support.apiserver.objects import status_object
from tests.support.gpu_cluster import objects
from tests.support.gpu_cluster.objects import Json

if TYPE_CHECKING:
    from tests.support.gpu_cluster.apiserver import StandInGpuCluster

Reply = tuple[int, Any]
KINDS = {
    "jobs": ("batch/v1", "Job", "count/jobs.batch"),
    "pytorchjobs": ("kubeflow.org/v1", "PyTorchJob", "count/pytorchjobs.kubeflow.org"),
    "configmaps": ("v1", "ConfigMap", "count/configmaps"),
    "resourcequotas": ("v1", "ResourceQuota", "count/resourcequotas"),
    "priorityclasses": ("scheduling.k8s.io/v1", "PriorityClass", None),
    "leases": ("coordination.k8s.io/v1", "Lease", None),
}
ACTIVE_PHASES = ("Pending", "Running")
QUOTA_SYNC_SECONDS = 1.0  # from a quota's creation to its status, on the cluster's clock
GPU = "nvidia.com/gpu"


@dataclass
class BatchState:
    objects: dict[tuple[str, str, str], Json] = field(default_factory=dict)  # (plural, ns, name)
    created: list[tuple[str, str, str]] = field(default_factory=list)
    peak_gpus: dict[str, int] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)  # uid -> on the clock
    finished: dict[str, float] = field(default_factory=dict)
    events: list[Json] = field(default_factory=list)  # the controllers' Events


def _conditions(obj: Json) -> list[Json]:
    return list((obj.get("status") or {}).get("conditions") or [])


def _finished(obj: Json) -> bool:
    return any(
        c.get("status") == "True" and c.get("type") in ("Complete", "Succeeded", "Failed")
        for c in _conditions(obj)
    )


def _selects(selector: dict[str, str], obj: Json) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


class BatchControllers:
    """The kinds above, their controllers and garbage collection. Callers hold the lock."""

    def __init__(self, cluster: StandInGpuCluster) -> None:
        self._cluster = cluster
        self.state = BatchState()

    # -- API ---------------------------------------------------------------------------------

    def create(self, plural: str, namespace: str, manifest: Json) -> Reply:
        api_version, kind, count = KINDS[plural]
        name = (manifest.get("metadata") or {}).get("name")
        if namespace and namespace not in self._cluster.namespaces:
            return 404, status_object(404, "NotFound", f'namespaces "{namespace}" not found')
        if not name:
            return 422, status_object(422, "Invalid", "metadata.name: Required value")
        if (plural, namespace, name) in self.state.objects:
            return 409, status_object(409, "AlreadyExists", f'{plural} "{name}" already exists')
        refusal = self._count_refusal(namespace, count) if count else None
        if refusal:
            return 403, status_object(
                403, "Forbidden", f'{plural} "{name}" is forbidden: {refusal}'
            )
        if plural == "pytorchjobs":
            problem = _invalid_pytorch_job(manifest)
            if problem:
                return 422, status_object(422, "Invalid", f'PyTorchJob "{name}": {problem}')
        obj = copy.deepcopy(manifest)
        obj["apiVersion"], obj["kind"] = api_version, kind
        now = self._cluster.clock()
        obj["metadata"] |= {
            "uid": str(uuid.uuid4()),
            "creationTimestamp": objects.now_rfc3339(now=now),
            "resourceVersion": "1",
        }
        if namespace:
            obj["metadata"]["namespace"] = namespace
        if plural == "resourcequotas":
            self.state.started[obj["metadata"]["uid"]] = now
        if plural in ("jobs", "pytorchjobs"):
            obj["status"] = {"startTime": objects.now_rfc3339(now=now), "conditions": []}
            self.state.started[obj["metadata"]["uid"]] = now
        self.state.objects[(plural, namespace, name)] = obj
        self.state.created.append((kind, namespace, name))
        if plural in ("jobs", "pytorchjobs"):
            self._sync(plural, namespace, name)
        return 201, copy.deepcopy(obj)

    def update(self, plural: str, namespace: str, name: str, manifest: Json) -> Reply:
        stored = self.state.objects.get((plural, namespace, name))
        if stored is None:
            return 404, status_object(404, "NotFound", f'{plural} "{name}" not found')
        version = (manifest.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != stored["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            )
            return 409, status_object(409, "Conflict", message)
        obj = copy.deepcopy(manifest)
        obj["metadata"] = {
            **(manifest.get("metadata") or {}),
            **{k: stored["metadata"][k] for k in ("uid", "creationTimestamp", "namespace")
               if k in stored["metadata"]},
            "resourceVersion": str(int(stored["metadata"]["resourceVersion"]) + 1),
        }  # fmt: skip
        self.state.objects[(plural, namespace, name)] = obj
        return 200, copy.deepcopy(obj)

    def get(self, plural: str, namespace: str, name: str) -> Reply:
        obj = self.state.objects.get((plural, namespace, name))
        if obj is None:
            return 404, status_object(404, "NotFound", f'{plural} "{name}" not found')
        return 200, copy.deepcopy(obj)

    def list(self, plural: str, namespace: str, selector: dict[str, str]) -> Reply:
        if namespace and namespace not in self._cluster.namespaces and plural != "configmaps":
            items: list[Json] = []
        else:
            items = [
                copy.deepcopy(obj)
                for (kind, ns, _), obj in sorted(self.state.objects.items())
                if kind == plural and ns == namespace and _selects(selector, obj)
            ]
        api_version, kind, _count = KINDS[plural]
        return 200, {
            "apiVersion": api_version,
            "kind": f"{kind}List",
            "metadata": {},
            "items": items,
        }

    def delete(self, plural: str, namespace: str, name: str, policy: str | None) -> Reply:
        obj = self.state.objects.pop((plural, namespace, name), None)
        if obj is None:
            return 404, status_object(404, "NotFound", f'{plural} "{name}" not found')
        if policy is None:
            policy = "Orphan" if plural == "jobs" else "Background"
        self.collect(obj["metadata"]["uid"], orphan=policy == "Orphan")
        return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def collect(self, uid: str, *, orphan: bool = False) -> None:
        """The garbage collector: dependents of ``uid`` deleted (or orphaned), recursively."""
        for key, obj in list(self.state.objects.items()):
            if _owned_by(obj, uid):
                if orphan:
                    _drop_owner(obj, uid)
                else:
                    del self.state.objects[key]
                    self.collect(obj["metadata"]["uid"])
        for key, pod in list(self._cluster.state.pods.items()):
            if _owned_by(pod, uid):
                if orphan:
                    updated = copy.deepcopy(pod)
                    _drop_owner(updated, uid)
                    self._cluster.commit("pods", key, updated, "MODIFIED")
                else:
                    self._cluster.pods.delete(key)

    # -- admission ---------------------------------------------------------------------------

    def _quotas(self, namespace: str) -> list[Json]:
        return [
            o
            for (p, ns, _), o in self.state.objects.items()
            if p == "resourcequotas" and ns == namespace
        ]

    def _unknown(self, namespace: str, resources: tuple[str, ...]) -> str | None:
        """The refusal of a create that a quota without a status yet covers, if any."""
        for quota in self._quotas(namespace):
            hard = (quota.get("spec") or {}).get("hard") or {}
            covered = sorted(r for r in hard if r in resources)
            if covered and not (quota.get("status") or {}).get("hard"):
                name = quota["metadata"]["name"]
                return f"status unknown for quota: {name}, resources: {','.join(covered)}"
        return None

    def _count_refusal(self, namespace: str, resource: str) -> str | None:
        plural = next(p for p, (_a, _k, c) in KINDS.items() if c == resource)
        used = sum(1 for (p, ns, _n) in self.state.objects if p == plural and ns == namespace)
        unknown = self._unknown(namespace, (resource,))
        if unknown:
            return unknown
        for quota in self._quotas(namespace):
            hard = (quota.get("spec") or {}).get("hard") or {}
            if resource in hard and used + 1 > int(hard[resource]):
                return (
                    f"exceeded quota: {quota['metadata']['name']}, requested: {resource}=1, "
                    f"used: {resource}={used}, limited: {resource}={hard[resource]}"
                )
        return None

    def _active_pods(self, namespace: str) -> list[Json]:
        return [
            p
            for (ns, _), p in self._cluster.state.pods.items()
            if ns == namespace and p.get("status", {}).get("phase") in ACTIVE_PHASES
        ]

    def admit_pod(self, namespace: str, manifest: Json) -> str | None:
        """Why admission refuses the pod (quota, PriorityClass), or None."""
        spec = manifest.get("spec") or {}
        priority = spec.get("priorityClassName")
        if (
            priority
            and not priority.startswith("system-")
            and ("priorityclasses", "", priority) not in self.state.objects
        ):
            return f"no PriorityClass with name {priority} was found"
        unknown = self._unknown(namespace, (f"requests.{GPU}", "pods", "count/pods"))
        if unknown:
            return unknown
        wanted = objects.gpus_requested(spec)
        active = self._active_pods(namespace)
        stored = [k for k in self._cluster.state.pods if k[0] == namespace]
        used_gpus = sum(objects.gpus_requested(p["spec"]) for p in active)
        for quota in self._quotas(namespace):
            hard = (quota.get("spec") or {}).get("hard") or {}
            name = quota["metadata"]["name"]
            limit = hard.get(f"requests.{GPU}")
            if limit is not None and used_gpus + wanted > int(limit):
                return (
                    f"exceeded quota: {name}, requested: requests.{GPU}={wanted}, used: "
                    f"requests.{GPU}={used_gpus}, limited: requests.{GPU}={limit}"
                )
            for resource, used in (("pods", len(active)), ("count/pods", len(stored))):
                if resource in hard and used + 1 > int(hard[resource]):
                    return (
                        f"exceeded quota: {name}, requested: {resource}=1, used: "
                        f"{resource}={used}, limited: {resource}={hard[resource]}"
                    )
        return None

    def record_usage(self, namespace: str) -> None:
        used = sum(objects.gpus_requested(p["spec"]) for p in self._active_pods(namespace))
        self.state.peak_gpus[namespace] = max(self.state.peak_gpus.get(namespace, 0), used)

    # -- controllers -------------------------------------------------------------------------

    def expected_pods(self, members: list[tuple[str, str]]) -> int:
        """How many pods the controller of these pods makes (1 without one)."""
        pods = self._cluster.state.pods
        owners = pods[members[0]]["metadata"].get("ownerReferences") or [] if members else []
        if not owners:
            return 1
        for (plural, _ns, _name), obj in self.state.objects.items():
            if obj["metadata"]["uid"] == owners[0].get("uid") and plural == "pytorchjobs":
                return len(_replica_pods(obj))
        return 1

    def reconcile(self) -> None:
        for plural, namespace, name in list(self.state.objects):
            if plural in ("jobs", "pytorchjobs"):
                self._sync(plural, namespace, name)
            elif plural == "resourcequotas":
                self._sync_quota(self.state.objects[(plural, namespace, name)])

    def _sync_quota(self, quota: Json) -> None:
        """The quota controller fills a new quota's status once it has synced (``used`` is
        not kept up to date here: admission counts for itself)."""
        if (quota.get("status") or {}).get("hard"):
            return
        if self._cluster.clock() - self.state.started[quota["metadata"]["uid"]] >= (
            QUOTA_SYNC_SECONDS
        ):
            hard = dict((quota.get("spec") or {}).get("hard") or {})
            quota["status"] = {"hard": hard, "used": dict.fromkeys(hard, "0")}

    def _pods_of(self, obj: Json) -> dict[tuple[str, str], Json]:
        uid = obj["metadata"]["uid"]
        return {key: pod for key, pod in self._cluster.state.pods.items() if _owned_by(pod, uid)}

    def _sync(self, plural: str, namespace: str, name: str) -> None:
        obj = self.state.objects.get((plural, namespace, name))
        if obj is None:
            return
        now = self._cluster.clock()
        if _finished(obj):
            self._expire(plural, namespace, name, obj, now)
            return
        pods = self._pods_of(obj)
        target = next((c for c in _conditions(obj) if c["type"] == "FailureTarget"), None)
        if target is not None:  # Failed once its pods have terminated
            if not any(p.get("status", {}).get("phase") in ACTIVE_PHASES for p in pods.values()):
                failed = {**target, "type": "Failed"}
                obj["status"]["conditions"].append(failed)
                obj["status"]["completionTime"] = objects.now_rfc3339(now=now)
                self.state.finished[obj["metadata"]["uid"]] = now
            return
        spec = obj.get("spec") or {}
        policy = spec.get("runPolicy") or {} if plural == "pytorchjobs" else spec
        started = self.state.started[obj["metadata"]["uid"]]
        deadline = policy.get("activeDeadlineSeconds")
        if deadline is not None and now - started >= float(deadline):
            self._end(
                obj,
                pods,
                ("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"),
                now=now,
                delete="all" if plural == "pytorchjobs" else "active",
            )
            return
        phases = {key[1]: pod.get("status", {}).get("phase") for key, pod in pods.items()}
        if "Failed" in phases.values():
            reason = "BackoffLimitExceeded" if plural == "jobs" else "PyTorchJobFailed"
            self._end(
                obj,
                pods,
                ("Failed", reason, "Job has reached the specified backoff limit"),
                now=now,
                delete="all" if plural == "pytorchjobs" else "none",
            )
            return
        if _succeeded(plural, obj, phases):
            self._end(
                obj,
                pods,
                ("Complete" if plural == "jobs" else "Succeeded", "Completed", "the job completed"),
                now=now,
                delete="all" if plural == "pytorchjobs" else "none",
            )
            return
        wanted = _replica_pods(obj) if plural == "pytorchjobs" else [(None, None)]
        existing = {
            pod["metadata"].get("labels", {}).get("stand-in/replica") for pod in pods.values()
        }
        for role, index in wanted:
            marker = f"{role}-{index}"
            if marker in existing:
                continue
            code, answer = self._cluster.pods.create(
                namespace, self._pod(plural, obj, role=role, index=index, marker=marker)
            )
            if code >= 400:
                self._failed_create(obj, f"Error creating: {answer.get('message')}")
            self.record_usage(namespace)
        running = [p for p in pods.values() if p.get("status", {}).get("phase") == "Running"]
        obj["status"]["active"] = len(
            [p for p in pods.values() if p.get("status", {}).get("phase") in ACTIVE_PHASES]
        )
        if (
            plural == "pytorchjobs"
            and len(running) == len(wanted)
            and not any(c["type"] == "Running" for c in _conditions(obj))
        ):
            obj["status"]["conditions"].append(
                {"type": "Running", "status": "True", "reason": "PyTorchJobRunning"}
            )

    def _failed_create(self, obj: Json, message: str) -> None:
        metadata = obj["metadata"]
        for event in self.state.events:
            if event["involvedObject"]["uid"] == metadata["uid"] and event["message"] == message:
                event["count"] += 1
                event["lastTimestamp"] = objects.now_rfc3339(now=self._cluster.clock())
                return
        now = objects.now_rfc3339(now=self._cluster.clock())
        self.state.events.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{metadata['name']}.{objects.suffix(message, now)}",
                    "namespace": metadata.get("namespace"),
                },
                "type": "Warning",
                "reason": "FailedCreate",
                "message": message,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "involvedObject": {
                    "apiVersion": obj["apiVersion"],
                    "kind": obj["kind"],
                    "name": metadata["name"],
                    "namespace": metadata.get("namespace"),
                    "uid": metadata["uid"],
                },
            }
        )

    def _pod(
        self, plural: str, obj: Json, role: str | None, index: int | None, marker: str
    ) -> Json:
        spec = obj["spec"]
        if plural == "jobs":
            template = spec["template"]
            name = f"{obj['metadata']['name']}-{objects.suffix(obj['metadata']['uid'])}"
            labels = {"job-name": obj["metadata"]["name"], "controller-uid": obj["metadata"]["uid"]}
        else:
            template = spec["pytorchReplicaSpecs"][role]["template"]
            name = f"{obj['metadata']['name']}-{str(role).lower()}-{index}"
            labels = {
                "training.kubeflow.org/job-name": obj["metadata"]["name"],
                "training.kubeflow.org/replica-type": str(role).lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
        metadata = copy.deepcopy(template.get("metadata") or {})
        metadata["labels"] = {
            **(metadata.get("labels") or {}),
            **labels,
            "stand-in/replica": marker,
        }
        metadata |= {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": obj["apiVersion"],
                    "kind": obj["kind"],
                    "name": obj["metadata"]["name"],
                    "uid": obj["metadata"]["uid"],
                    "controller": True,
                }
            ],
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": copy.deepcopy(template["spec"]),
        }

    def _end(
        self,
        obj: Json,
        pods: dict[tuple[str, str], Json],
        condition: tuple[str, str, str],  # type, reason, message
        *,
        now: float,
        delete: str,
    ) -> None:
        """End the job; ``delete`` its pods: "all" (cleanPodPolicy All), "active" (the Job
        controller past a deadline) or "none"."""
        kind, reason, message = condition
        if kind == "Failed" and obj["kind"] == "Job":
            kind = "FailureTarget"  # Failed follows once the pods have terminated (_sync)
        obj["status"]["conditions"].append(
            {"type": kind, "status": "True", "reason": reason, "message": message}
        )
        if kind != "FailureTarget":
            obj["status"]["completionTime"] = objects.now_rfc3339(now=now)
            self.state.finished[obj["metadata"]["uid"]] = now
        for key, pod in pods.items():
            active = pod.get("status", {}).get("phase") in ACTIVE_PHASES
            if delete == "all" or (delete == "active" and active):
                self._cluster.pods.delete(key)

    def _expire(self, plural: str, namespace: str, name: str, obj: Json, now: float) -> None:
        spec = obj.get("spec") or {}
        policy = spec.get("runPolicy") or {} if plural == "pytorchjobs" else spec
        ttl = policy.get("ttlSecondsAfterFinished")
        finished = self.state.finished[obj["metadata"]["uid"]]
        if ttl is not None and now - finished >= float(ttl):
            self.delete(plural, namespace, name, "Background")


def _owned_by(obj: Json, uid: str) -> bool:
    return any(o.get("uid") == uid for o in obj.get("metadata", {}).get("ownerReferences") or [])


def _drop_owner(obj: Json, uid: str) -> None:
    obj["metadata"]["ownerReferences"] = [
        o for o in obj["metadata"].get("ownerReferences") or [] if o.get("uid") != uid
    ]


def _replica_pods(obj: Json) -> list[tuple[str | None, int | None]]:
    replicas = obj["spec"]["pytorchReplicaSpecs"]
    return [
        (role, index)
        for role in ("Master", "Worker")
        if role in replicas
        for index in range(int(replicas[role].get("replicas", 1)))
    ]


def _succeeded(plural: str, obj: Json, phases: dict[str, Any]) -> bool:
    if plural == "jobs":
        return "Succeeded" in phases.values()
    name = obj["metadata"]["name"]
    leader = (
        f"{name}-master-0"
        if "Master" in obj["spec"]["pytorchReplicaSpecs"]
        else (f"{name}-worker-0")
    )
    return phases.get(leader) == "Succeeded"


def _invalid_pytorch_job(manifest: Json) -> str | None:
    replicas = (manifest.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if not replicas:
        return "spec.pytorchReplicaSpecs: Required value"
    for role, replica in replicas.items():
        if role not in ("Master", "Worker"):
            return f"unknown replica type {role}"
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not any(c.get("name") == "pytorch" for c in containers):
            return f"{role}: there is no container named pytorch"
        if role == "Master" and int(replica.get("replicas", 1)) != 1:
            return "there must be only 1 master replica"
    return None
