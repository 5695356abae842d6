"""What kind of workload a GPU pod belongs to, from its owner chain or its labels, and the prior
that kind gives the classifier (training or serving).

The prior only decides busy GPUs whose waveform shows no loop and no waiting ranks: an idle GPU
stays idle and a clear loop stays training whatever the owner (``analysis.classify``). The
tables below are the documented contract (docs/analysis.md, "Workload context").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from profiler_app.core.model import Prior

# Owner kinds, as in ownerReferences (the top of the chain once ReplicaSet -> Deployment and
# Job -> CronJob are resolved).
TRAINING_KINDS = frozenset(
    {
        "Job",  # batch/v1 and Volcano's batch.volcano.sh/v1alpha1 alike
        "CronJob",
        "PyTorchJob",
        "TFJob",
        "MPIJob",
        "XGBoostJob",
        "PaddleJob",
        "JAXJob",
        "KubeflowJob",  # a Kubeflow training job whose operator label is missing
        "JobSet",
        "RayJob",
    }
)
SERVING_KINDS = frozenset(
    {
        "Deployment",
        "ReplicaSet",
        "StatefulSet",
        "LeaderWorkerSet",
        "InferenceService",
        "RayService",
    }
)

# Well-known pod labels naming the workload, most specific first: (label, kind); the label's
# value is the workload's name.
# A label wins over the owner chain, which often stops at an intermediate object (a JobSet's
# pods are owned by Jobs, an InferenceService's by a ReplicaSet).
# A Kubeflow Trainer TrainJob puts no label of its own on its pods: it runs them through a
# JobSet of its name that it owns (kubeflow/trainer v2.3.0,
# pkg/runtime/framework/plugins/jobset/jobset.go lines 413-433), whose controller labels every
# pod with the JobSet's name (kubernetes-sigs/jobset v0.12.0, pkg/controllers/jobset_controller.go
# lines 950 and 1020). Its pods are training as a JobSet named after the TrainJob.
WORKLOAD_LABELS: tuple[tuple[str, str], ...] = (
    ("serving.kserve.io/inferenceservice", "InferenceService"),
    ("leaderworkerset.sigs.k8s.io/name", "LeaderWorkerSet"),
    ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
    ("training.kubeflow.org/job-name", "KubeflowJob"),  # kind from operator-name, below
    ("volcano.sh/job-name", "Job"),
    ("batch.kubernetes.io/job-name", "Job"),
    ("job-name", "Job"),
)
# training.kubeflow.org/operator-name values -> kind (the training operator sets both labels).
KUBEFLOW_OPERATORS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
}
# KubeRay marks the pods of clusters it made for a RayJob or a RayService.
RAY_ORIGIN_LABEL = "ray.io/originated-from-crd"
RAY_CLUSTER_LABEL = "ray.io/cluster"
# A Deployment's ReplicaSet is named <deployment>-<pod-template-hash>, and its pods carry the hash.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
# A CronJob's Job is named <cronjob>-<scheduled time in minutes since the epoch> (8 digits
# since 1989).
CRONJOB_JOB_NAME = re.compile(r"^(?P<cronjob>.+)-\d{8,}$")
# Every label the tables read: the pod watcher keeps only these of each pod.
WORKLOAD_LABEL_KEYS = frozenset(
    [key for key, _ in WORKLOAD_LABELS]
    + [
        "training.kubeflow.org/operator-name",
        RAY_ORIGIN_LABEL,
        RAY_CLUSTER_LABEL,
        POD_TEMPLATE_HASH_LABEL,
    ]
)


@dataclass(frozen=True)
class Workload:
    """The workload a pod belongs to: its kind and name, and the prior that kind gives."""

    kind: str
    name: str
    prior: Prior | None

    @property
    def reason(self) -> str:
        return f"owner {self.kind}"


def prior_of_kind(kind: str) -> Prior | None:
    if kind in TRAINING_KINDS:
        return Prior.TRAINING
    if kind in SERVING_KINDS:
        return Prior.SERVING
    return None


def _sanitised(label: str) -> str:
    """A Kubernetes label as a Prometheus label name (dcgm-exporter's pod-label enrichment)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _label(labels: Mapping[str, str], key: str) -> str | None:
    return labels.get(key) or labels.get(_sanitised(key)) or None


def workload_from_labels(labels: Mapping[str, str]) -> Workload | None:
    """The workload named by well-known pod labels (as Kubernetes or as dcgm-exporter spells
    them), or None."""
    for key, labelled_kind in WORKLOAD_LABELS:
        name = _label(labels, key)
        if name is None:
            continue
        kind = labelled_kind
        if key.startswith("training.kubeflow.org/"):
            operator = _label(labels, "training.kubeflow.org/operator-name") or ""
            kind = KUBEFLOW_OPERATORS.get(operator, kind)
        return Workload(kind, name, prior_of_kind(kind))
    origin = _label(labels, RAY_ORIGIN_LABEL)
    if origin in ("RayJob", "RayService"):
        name = _label(labels, RAY_CLUSTER_LABEL) or ""
        return Workload(origin, name, prior_of_kind(origin))
    return None


def top_owner(kind: str, name: str, labels: Mapping[str, str]) -> tuple[str, str]:
    """The top of a pod's owner chain from its controller, without reading other objects (the
    profiler may read pods only): a ReplicaSet named <deployment>-<pod-template-hash> belongs to
    that Deployment, a Job named <cronjob>-<8+ digits> to that CronJob."""
    if kind == "ReplicaSet":
        suffix = f"-{labels.get(POD_TEMPLATE_HASH_LABEL, '')}"
        if len(suffix) > 1 and name.endswith(suffix):
            return "Deployment", name.removesuffix(suffix)
    if kind == "Job" and (match := CRONJOB_JOB_NAME.match(name)):
        return "CronJob", match.group("cronjob")
    return kind, name


def workload_from_owner(kind: str, name: str, labels: Mapping[str, str]) -> Workload | None:
    """The workload of a pod whose controller is ``kind``/``name`` (the top of the chain is
    resolved by ``top_owner``); well-known labels win. None for a bare pod without them."""
    labelled = workload_from_labels(labels)
    if labelled is not None or not kind:
        return labelled
    top_kind, top_name = top_owner(kind, name, labels)
    return Workload(top_kind, top_name, prior_of_kind(top_kind))
