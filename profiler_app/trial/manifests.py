"""The training job a trial copies, and each trial's manifest.

A template is a Job, a Kubeflow PyTorchJob or a Pod, from a file or read from the API server and
stripped of what the server owns (status, UIDs, owner references, versions). A Pod becomes a
Job's template, so that every trial carries a deadline, no retries and a time to live.

``trial_manifest`` writes one placement into a copy of the template, with every safety setting:
the trial namespace, the low PriorityClass, ``activeDeadlineSeconds``, ``backoffLimit: 0`` and
``ttlSecondsAfterFinished`` (for a PyTorchJob the same under ``runPolicy``, with
``cleanPodPolicy: All``), an owner reference to the run's anchor, ``GPU_PROFILER_TRIAL=1`` in
every container, and the layout: required pod affinity on the node's hostname (packed) or a
topology spread with ``maxSkew: 1`` (spread). Without ``allow_scale_up`` the pods may only go to
nodes that exist now, so a pending trial never makes Karpenter launch one.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from profiler_app.core.annotations import DEFAULT_DOMAIN
from profiler_app.core.errors import UserError
from profiler_app.core.gpu_resources import DEFAULT_GPU_RESOURCES
from profiler_app.trial.grace import DEFAULT_GRACE_SECONDS, bound_stopping, stopping_notes
from profiler_app.trial.placement import (
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    PACKED,
    Placement,
)
from profiler_app.trial.volumes import TRIAL_ENV, mount_read_only, volume_warnings

Json = dict[str, Any]
JOB, PYTORCH_JOB, POD = "Job", "PyTorchJob", "Pod"
API_VERSIONS = {JOB: "batch/v1", PYTORCH_JOB: "kubeflow.org/v1", POD: "v1"}
PYTORCH_CONTAINER = "pytorch"  # the container the training operator configures
MASTER, WORKER = "Master", "Worker"
RUN_LABEL = f"{DEFAULT_DOMAIN}/trial-run"
TRIAL_LABEL = f"{DEFAULT_DOMAIN}/trial"
MANAGED_BY = ("app.kubernetes.io/managed-by", "gpu-profiler-trial")
WEAK, STRONG = "weak", "strong"
PER_GPU, GLOBAL = "per-gpu", "global"
# Metadata and fields the API server or a controller owns: never copied into a trial.
SERVER_METADATA = (
    "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
    "deletionGracePeriodSeconds", "managedFields", "ownerReferences", "selfLink", "finalizers",
    "generateName",
)  # fmt: skip
SERVER_LABELS = (
    "controller-uid", "batch.kubernetes.io/controller-uid", "job-name",
    "batch.kubernetes.io/job-name", "pod-template-hash",
    "training.kubeflow.org/job-name", "training.kubeflow.org/operator-name",
    "training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index",
    "training.kubeflow.org/job-role",
)  # fmt: skip
SERVER_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


@dataclass(frozen=True)
class Template:
    """A stripped workload whose GPU pods a trial resizes."""

    kind: str
    name: str
    namespace: str | None
    manifest: Json
    gpus_per_pod: int
    pods: int

    @property
    def gpus(self) -> int:
        return self.gpus_per_pod * self.pods

    def to_json(self) -> Json:
        return {
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "manifest": self.manifest,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Template:
        return load_template(dict(document["manifest"]), "the plan")


@dataclass(frozen=True)
class BatchScaling:
    """How trials keep the batch: ``weak`` keeps the per-GPU batch, ``strong`` the global one.
    With ``env`` set, that variable of the GPU container holds the batch the script reads,
    per GPU or global (``scope``), and is rewritten for each trial's GPUs."""

    scale: str = WEAK
    env: str | None = None
    scope: str = PER_GPU

    def to_json(self) -> Json:
        return {"scale": self.scale, "env": self.env, "scope": self.scope}

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> BatchScaling:
        return cls(str(document["scale"]), document.get("env"), str(document["scope"]))


@dataclass(frozen=True)
class TrialSettings:
    """What every trial object of one run carries."""

    namespace: str
    run_id: str
    priority_class: str
    deadline_seconds: int
    ttl_seconds: int
    anchor_name: str
    anchor_uid: str
    allow_scale_up: bool = False
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    read_only_volumes: bool = False


def strip_server_fields(obj: Json) -> Json:
    """A copy without status and what the server owns (UIDs, owner references, versions)."""
    clean = copy.deepcopy(obj)
    clean.pop("status", None)
    metadata = clean.setdefault("metadata", {})
    for key in SERVER_METADATA:
        metadata.pop(key, None)
    for key in SERVER_ANNOTATIONS:
        (metadata.get("annotations") or {}).pop(key, None)
    _strip_labels(metadata)
    for _role, spec in pod_specs(clean):
        spec.pop("nodeName", None)
    for template in _pod_templates(clean):
        _strip_labels(template.setdefault("metadata", {}))
    if clean.get("kind") == JOB:
        clean.get("spec", {}).pop("selector", None)  # the Job controller makes its own
        clean.get("spec", {}).pop("manualSelector", None)
    return clean


def _strip_labels(metadata: Json) -> None:
    labels = metadata.get("labels") or {}
    for key in SERVER_LABELS:
        labels.pop(key, None)


def _pod_templates(manifest: Json) -> Iterator[Json]:
    """The pod templates of a Job or PyTorchJob (none for a Pod)."""
    spec = manifest.get("spec") or {}
    if manifest.get("kind") == JOB and isinstance(spec.get("template"), dict):
        yield spec["template"]
    if manifest.get("kind") == PYTORCH_JOB:
        for replica in (spec.get("pytorchReplicaSpecs") or {}).values():
            if isinstance(replica, dict) and isinstance(replica.get("template"), dict):
                yield replica["template"]


def pod_specs(manifest: Json) -> Iterator[tuple[str, Json]]:
    """``(role, pod spec)`` of every pod shape in the manifest."""
    if manifest.get("kind") == POD:
        yield POD, manifest.setdefault("spec", {})
    elif manifest.get("kind") == JOB:
        yield JOB, manifest.get("spec", {}).get("template", {}).setdefault("spec", {})
    elif manifest.get("kind") == PYTORCH_JOB:
        for role, replica in (manifest.get("spec", {}).get("pytorchReplicaSpecs") or {}).items():
            yield role, replica.setdefault("template", {}).setdefault("spec", {})


def _gpu_limit(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    text = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
        resources.get("requests") or {}
    ).get(GPU_RESOURCE)
    try:
        return int(str(text or "0"))
    except ValueError:
        return 0


def _other_gpu_resources(spec: Mapping[str, Any]) -> set[str]:
    """The GPU resources (gpu_resources) other than whole GPUs that the spec's containers name."""
    names: set[str] = set()
    for container in spec.get("containers") or ():
        for section in ("limits", "requests"):
            names.update(
                DEFAULT_GPU_RESOURCES.requested((container.get("resources") or {}).get(section))
            )
    return names - {GPU_RESOURCE}


def gpu_container(spec: Mapping[str, Any], where: str) -> Json | None:
    """The one container of a pod spec that requests GPUs (None if none does)."""
    holders = [c for c in spec.get("containers") or () if _gpu_limit(c) > 0]
    if len(holders) > 1:
        names = ", ".join(str(c.get("name")) for c in holders)
        raise UserError(
            f"{where}: several containers request {GPU_RESOURCE} ({names}); a trial resizes one"
        )
    return holders[0] if holders else None


# The ServiceAccount the stacks give the trial runner (infra/trials.py): a trial's pods running as
# it would hold the runner's rights to create and delete the namespace's Jobs.
TRIAL_RUNNER_ACCOUNT = "gpu-profiler-trial"


def _runner_account_refused(shapes: list[tuple[str, Json]], where: str) -> None:
    for role, spec in shapes:
        for key in ("serviceAccountName", "serviceAccount"):
            if spec.get(key) == TRIAL_RUNNER_ACCOUNT:
                shape = "" if role in (POD, JOB) else f" ({role})"
                raise UserError(
                    f"{where}{shape}: spec.{key} is {TRIAL_RUNNER_ACCOUNT}, the trial runner's "
                    "ServiceAccount, which would give the trial's pods the runner's rights; "
                    "name the workload's own ServiceAccount or none"
                )


def load_template(document: Any, source: str) -> Template:
    """The template in a manifest, checked: a known kind with exactly one GPU container per pod
    shape (UserError, one line, otherwise)."""
    if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
        raise UserError(f"{source} is not a Kubernetes object")
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if kind not in API_VERSIONS or API_VERSIONS[kind] != api_version:
        raise UserError(
            f"{source}: unknown kind {api_version}/{kind}: a trial copies a batch/v1 Job, a "
            "kubeflow.org/v1 PyTorchJob or a v1 Pod"
        )
    manifest = strip_server_fields(document)
    name = str(manifest["metadata"].get("name") or "")
    if not name:
        raise UserError(f"{source}: the {kind} has no metadata.name")
    where = f"{source}: {kind} {name}"
    if kind == JOB:
        spec = manifest.get("spec") or {}
        if int(spec.get("parallelism", 1) or 1) > 1:
            raise UserError(
                f"{where} runs {spec['parallelism']} pods in parallel; a trial runs "
                "one pod of a Job (use a PyTorchJob for distributed training)"
            )
    shapes = list(pod_specs(manifest))
    if not shapes or not all(spec.get("containers") for _, spec in shapes):
        raise UserError(f"{where} has no containers")
    _runner_account_refused(shapes, where)
    per_pod = {role: _gpu_limit(gpu_container(spec, where) or {}) for role, spec in shapes}
    if not any(per_pod.values()):
        others = sorted({name for _, spec in shapes for name in _other_gpu_resources(spec)})
        if others:  # MIG devices or shared GPUs: GPUs all the same, but not whole ones
            raise UserError(
                f"{where} requests {', '.join(others)}, not {GPU_RESOURCE}: a trial places "
                "whole GPUs"
            )
        raise UserError(f"{where} requests no {GPU_RESOURCE}: there is no GPU placement to try")
    if len(set(per_pod.values())) > 1:
        raise UserError(f"{where}: its replicas request different GPU counts {per_pod}")
    pods = 1
    if kind == PYTORCH_JOB:
        replicas = manifest["spec"]["pytorchReplicaSpecs"]
        if set(replicas) - {MASTER, WORKER}:
            raise UserError(
                f"{where}: replica types {sorted(replicas)}: a trial knows Master and Worker"
            )
        pods = sum(int(replicas[role].get("replicas", 1) or 0) for role in replicas)
    return Template(
        kind,
        name,
        manifest["metadata"].get("namespace"),
        manifest,
        next(iter(per_pod.values())),
        max(pods, 1),
    )


def template_warnings(
    template: Template, trial_namespace: str, grace_seconds: int = DEFAULT_GRACE_SECONDS
) -> list[str]:
    """What a user must know before trials run: volumes a trial could write to, how trials
    stop (grace period, preStop hooks), and objects the pods need in the trial namespace."""
    warnings: list[str] = []
    needed: dict[str, set[str]] = {}
    specs = [spec for _role, spec in pod_specs(copy.deepcopy(template.manifest))]
    for spec in specs:
        warnings += volume_warnings(spec)
        for kind, name in _referenced(spec):
            needed.setdefault(kind, set()).add(name)
    warnings += stopping_notes(specs, grace_seconds)
    if needed and template.namespace != trial_namespace:
        listed = "; ".join(
            f"{kind} {', '.join(sorted(names))}" for kind, names in sorted(needed.items())
        )
        warnings.append(f"trials run in namespace {trial_namespace}: the pods need {listed} there")
    return list(dict.fromkeys(warnings))


# (kind, where a pod spec names one): volumes, envFrom and env valueFrom.
_VOLUME_REFERENCES = (
    ("PersistentVolumeClaim", "persistentVolumeClaim", "claimName"),
    ("ConfigMap", "configMap", "name"),
    ("Secret", "secret", "secretName"),
)
_ENV_REFERENCES = (
    ("ConfigMap", "configMapRef", "configMapKeyRef"),
    ("Secret", "secretRef", "secretKeyRef"),
)


def _referenced(spec: Json) -> Iterator[tuple[str, str]]:
    """``(kind, name)`` of the namespaced objects a pod spec needs."""
    for volume in spec.get("volumes") or ():
        for kind, key, name_key in _VOLUME_REFERENCES:
            if volume.get(key):
                yield kind, str(volume[key].get(name_key))
    for container in spec.get("containers") or ():
        for kind, from_key, value_key in _ENV_REFERENCES:
            for source in container.get("envFrom") or ():
                if source.get(from_key):
                    yield kind, str(source[from_key].get("name"))
            for variable in container.get("env") or ():
                reference = (variable.get("valueFrom") or {}).get(value_key)
                if reference:
                    yield kind, str(reference.get("name"))


def batch_value(template: Template, scaling: BatchScaling, gpus: int) -> int | None:
    """The batch variable's value for a trial on ``gpus`` GPUs (None: nothing to rewrite).
    UserError when the template lacks the variable; ValueError when the batch does not divide."""
    if scaling.env is None:
        return None
    spec = next(spec for _, spec in pod_specs(copy.deepcopy(template.manifest)))
    container = gpu_container(spec, template.name) or {}
    variable = next((v for v in container.get("env") or () if v.get("name") == scaling.env), None)
    try:
        value = int(str((variable or {}).get("value")))
    except ValueError:
        value = 0
    if variable is None or value < 1:
        raise UserError(
            f"--batch-env {scaling.env}: the GPU container {container.get('name')} "
            "has no such variable with a whole-number value"
        )
    keeps_per_gpu = scaling.scale == WEAK
    if keeps_per_gpu == (scaling.scope == PER_GPU):
        return value  # the variable already holds what stays constant
    if scaling.scope == GLOBAL:  # weak: global = per-GPU x GPUs
        if value % template.gpus:
            raise ValueError(f"global batch {value} does not split over {template.gpus} GPUs")
        return value // template.gpus * gpus
    total = value * template.gpus  # strong, per-GPU variable: global / GPUs
    if total % gpus:
        raise ValueError(f"global batch {total} does not split over {gpus} GPUs")
    return total // gpus


def trial_name(run_id: str, index: int) -> str:
    return f"trial-{run_id}-{index}"


def trial_manifest(
    template: Template,
    placement: Placement,
    settings: TrialSettings,
    *,
    index: int,
    hostnames: tuple[str, ...],
    scaling: BatchScaling | None = None,
) -> Json:
    """The trial object for one placement (see the module docstring)."""
    name = trial_name(settings.run_id, index)
    labels = {RUN_LABEL: settings.run_id, TRIAL_LABEL: name, MANAGED_BY[0]: MANAGED_BY[1]}
    scaling = scaling or BatchScaling()
    source = copy.deepcopy(template.manifest)
    batch = batch_value(template, scaling, placement.gpus)
    if template.kind == POD:
        pod_metadata = {
            key: value
            for key, value in source["metadata"].items()
            if key in ("labels", "annotations")
        }
        source = {
            "apiVersion": API_VERSIONS[JOB],
            "kind": JOB,
            "metadata": {},
            "spec": {"template": {"metadata": pod_metadata, "spec": source["spec"]}},
        }
    source["metadata"] = {
        "name": name,
        "namespace": settings.namespace,
        "labels": {**(source["metadata"].get("labels") or {}), **labels},
        "annotations": {
            **(source["metadata"].get("annotations") or {}),
            f"{DEFAULT_DOMAIN}/trial-of": f"{template.kind}/{template.namespace or ''}/"
            f"{template.name}",
            f"{DEFAULT_DOMAIN}/trial-placement": placement.describe(),
        },
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": settings.anchor_name,
                "uid": settings.anchor_uid,
            }
        ],
    }
    if source["kind"] == JOB:
        _job(source, settings)
    else:
        _pytorch_job(source, placement, settings)
    for template_part in _pod_templates(source):
        metadata = template_part.setdefault("metadata", {})
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
        _pod_spec(
            template_part["spec"],
            placement,
            settings=settings,
            labels=labels,
            hostnames=hostnames,
            scaling=scaling,
            batch=batch,
        )
    return source


def _job(job: Json, settings: TrialSettings) -> None:
    spec = job.setdefault("spec", {})
    spec.update(
        parallelism=1,
        completions=1,
        backoffLimit=0,
        activeDeadlineSeconds=settings.deadline_seconds,
        ttlSecondsAfterFinished=settings.ttl_seconds,
    )
    spec.pop("suspend", None)
    spec.pop("podFailurePolicy", None)  # backoffLimit 0 already ends the Job at the first failure
    spec["template"]["spec"]["restartPolicy"] = "Never"


def _pytorch_job(job: Json, placement: Placement, settings: TrialSettings) -> None:
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    pods = placement.pods
    if MASTER in replicas:
        replicas[MASTER]["replicas"] = 1
        if pods > 1:
            replicas.setdefault(WORKER, copy.deepcopy(replicas[MASTER]))["replicas"] = pods - 1
        else:
            replicas.pop(WORKER, None)
    else:
        replicas[WORKER]["replicas"] = pods
    for replica in replicas.values():
        replica["restartPolicy"] = "Never"
    spec["nprocPerNode"] = str(placement.gpus_per_pod)
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        workers = replicas.get(WORKER, {}).get("replicas", 1)
        elastic.update(minReplicas=workers, maxReplicas=workers)
        elastic.pop("metrics", None)
        elastic.pop("nProcPerNode", None)
    run_policy = spec.setdefault("runPolicy", {})
    run_policy.update(
        cleanPodPolicy="All",
        backoffLimit=0,
        activeDeadlineSeconds=settings.deadline_seconds,
        ttlSecondsAfterFinished=settings.ttl_seconds,
        suspend=False,
    )
    if "schedulingPolicy" in run_policy:
        run_policy["schedulingPolicy"]["priorityClass"] = settings.priority_class


def _pod_spec(
    spec: Json,
    placement: Placement,
    *,
    settings: TrialSettings,
    labels: Mapping[str, str],
    hostnames: tuple[str, ...],
    scaling: BatchScaling,
    batch: int | None,
) -> None:
    spec["priorityClassName"] = settings.priority_class
    bound_stopping(spec, settings.grace_seconds)
    if settings.read_only_volumes:
        mount_read_only(spec)
    for owned in ("priority", "preemptionPolicy", "nodeName", "topologySpreadConstraints"):
        spec.pop(owned, None)
    for container in spec.get("containers") or ():
        env = [v for v in container.get("env") or () if v.get("name") != TRIAL_ENV]
        env.append({"name": TRIAL_ENV, "value": "1"})
        if batch is not None:
            env = [
                {"name": v["name"], "value": str(batch)} if v.get("name") == scaling.env else v
                for v in env
            ]
        container["env"] = env
    gpu = gpu_container(spec, settings.run_id)
    if gpu is not None:
        resources = gpu.setdefault("resources", {})
        count = str(placement.gpus_per_pod)
        resources.setdefault("limits", {})[GPU_RESOURCE] = count
        if GPU_RESOURCE in (resources.get("requests") or {}):
            resources["requests"][GPU_RESOURCE] = count
    if placement.model is not None and placement.model_label is not None:
        spec.setdefault("nodeSelector", {})[placement.model_label] = placement.model
    affinity = spec.setdefault("affinity", {})
    affinity.pop("podAffinity", None)  # the trial's layout replaces the template's
    affinity.pop("podAntiAffinity", None)
    trial_selector = {"matchLabels": {TRIAL_LABEL: labels[TRIAL_LABEL]}}
    if placement.pods > 1 and placement.layout == PACKED:
        affinity["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": trial_selector, "topologyKey": HOSTNAME_LABEL}
            ]
        }
    elif placement.pods > 1:
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": HOSTNAME_LABEL,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": trial_selector,
            }
        ]
    if not settings.allow_scale_up:
        _only_on(affinity, hostnames)
    if not affinity:
        spec.pop("affinity")


def _only_on(affinity: Json, hostnames: tuple[str, ...]) -> None:
    """Require one of ``hostnames`` in every node-affinity term (terms are ORed, so each gets
    it), or in a new term when there is none."""
    requirement = {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(hostnames)}
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or ()), requirement]
