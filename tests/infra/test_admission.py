"""The admission policies' CEL, evaluated with cel-python on requests built as the API server
builds them (tests/infra/admission_double.py says whence, and what a real cluster adds).

Test double: cel-python instead of the API server's admission; the SQLite pod comes from the
stack under Pulumi's mock engine.

Objects are as the API server holds them: a GPU pod with its defaults and owner, a node with the
GPU taint; the trial objects are the trial's golden manifests (tests/unit/data/trial).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import pytest
import yaml

from infra.admission import DO_NOT_DISRUPT, profiler_policy, store_namespace_policy, trial_policy
from infra.profiler import STORE_DIR
from infra.render.program import ProgramRun, run_stack
from infra.store.daemon import SQLITE_INIT_CAPABILITIES
from infra.trials import LABELS, ROLE_RULES, TRIAL_ACCOUNT, TRIAL_NAMESPACE
from profiler_app.core.annotations import DEFAULT_DOMAIN
from profiler_app.sinks.kubernetes.protection import marker_key
from profiler_app.trial.cluster import TrialCluster
from profiler_app.trial.lock import LEASE_NAME, NamespaceLock
from profiler_app.trial.manifests import MANAGED_BY
from tests.infra.admission_double import Json, admit, request, user
from tests.infra.conftest import KUBEADM_STACK
from tests.unit.test_trial_manifests import DATA

PROFILER = "system:serviceaccount:gpu-profiler:gpu-profiler"
TRIAL_RUNNER = f"system:serviceaccount:{TRIAL_NAMESPACE}:{TRIAL_ACCOUNT}"
ADMIN = "kubernetes-admin"  # kubeadm's admin.conf; EKS maps the stack's creator similarly
OWN, OTHER = "ip-10-0-1-17.ec2.internal", "ip-10-0-2-42.ec2.internal"
POLICY = profiler_policy("gpu-profiler", "gpu-profiler", DEFAULT_DOMAIN)
MARKER = marker_key(DEFAULT_DOMAIN)


def gpu_pod(node: str | None = OWN) -> Json:
    pod: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "bert-train-0",
            "namespace": "ml",
            "uid": "3e1f6c2a-0000-4000-8000-0000000000aa",
            "resourceVersion": "81234",
            "labels": {"app": "bert", "batch.kubernetes.io/job-name": "bert-train"},
            "annotations": {"team.example/owner": "nlp", f"{DEFAULT_DOMAIN}/gpu-util": "0.82"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "bert-train",
                    "uid": "9c2d1e4f-0000-4000-8000-0000000000bb",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        "status": {"phase": "Running"},
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def gpu_node(name: str = OWN) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "7b2d4c1e-0000-4000-8000-000000000003",
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "providerID": f"aws:///us-west-2a/i-0{name[3:8]}",
            "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
        },
    }


def changed(old: Json, change: Callable[[Json], Any]) -> Json:
    new = copy.deepcopy(old)
    change(new)
    return new


def update(username: str, old: Json, change: Callable[[Json], Any], node: str | None = OWN) -> Json:
    return request("UPDATE", user(username, node), old=old, new=changed(old, change))


def protect(pod: Json) -> None:
    pod["metadata"]["annotations"].update({DO_NOT_DISRUPT: "true", MARKER: "training"})


def release(pod: Json) -> None:
    for key in (DO_NOT_DISRUPT, MARKER):
        pod["metadata"]["annotations"].pop(key)


def protected(node: str = OWN) -> Json:
    return changed(gpu_pod(node), protect)


# -- the profiler: admitted ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "change"),
    [
        pytest.param(gpu_pod(), protect, id="protection-on"),
        pytest.param(protected(), release, id="protection-off"),
        pytest.param(
            gpu_pod(),
            lambda p: p["metadata"]["annotations"].update({f"{DEFAULT_DOMAIN}/gpu-util": "0.1"}),
            id="own-pod-annotation",
        ),
        pytest.param(
            gpu_node(),
            lambda n: n["metadata"]["annotations"].update({f"{DEFAULT_DOMAIN}/idle-gpus": "2"}),
            id="own-node-annotation",
        ),
        pytest.param(
            changed(gpu_pod(), lambda p: p["metadata"].pop("annotations")),
            lambda p: p["metadata"].update({"annotations": {DO_NOT_DISRUPT: "true"}}),
            id="first-annotation-of-a-pod",
        ),
    ],
)
def test_the_profiler_changes_its_annotations_on_its_own_node(
    old: Json, change: Callable[[Json], Any]
) -> None:
    verdict = admit(POLICY, update(PROFILER, old, change))
    assert verdict.judged
    assert verdict.allowed, verdict.message


def test_unprotect_runs_as_the_person_and_is_not_judged() -> None:
    """`gpu-profiler unprotect` (and `pulumi destroy`'s run of it) uses the kubeconfig given:
    cluster-wide, other nodes' pods too."""
    verdict = admit(POLICY, update(ADMIN, protected(OTHER), release, node=None))
    assert verdict == type(verdict)(allowed=True, judged=False)


def test_reads_and_other_accounts_are_not_judged() -> None:
    other_account = "system:serviceaccount:kube-system:node-controller"
    taint = update(other_account, gpu_node(OTHER), lambda n: n["spec"]["taints"].append({}))
    assert not admit(POLICY, taint).judged
    status = update(PROFILER, gpu_pod(), protect)
    status["subResource"] = "status"
    assert not admit(POLICY, status).judged


# -- the profiler: denied -----------------------------------------------------------------------


def _set_image(pod: Json) -> None:
    pod["spec"]["containers"][0]["image"] = "attacker.example/miner:latest"


def _taint(node: Json) -> None:
    node["spec"]["taints"].append({"key": "evict", "effect": "NoExecute"})


DENIED: dict[str, tuple[Json, Callable[[Json], Any], str | None, str]] = {
    "another-nodes-pod": (gpu_pod(OTHER), protect, OWN, "only its own node"),
    "another-node": (
        gpu_node(OTHER),
        lambda n: n["metadata"]["annotations"].update({f"{DEFAULT_DOMAIN}/x": "1"}),
        OWN,
        "only its own node",
    ),
    "pending-pod": (gpu_pod(None), protect, OWN, "only its own node"),
    "token-without-node-claim": (gpu_pod(), protect, None, "only its own node"),
    "image-change": (gpu_pod(), _set_image, OWN, "spec"),
    "own-node-taint": (gpu_node(), _taint, OWN, "spec"),
    "label-change": (
        gpu_pod(),
        lambda p: p["metadata"]["labels"].update({"app": "other"}),
        OWN,
        "labels",
    ),
    "label-removal": (
        gpu_node(),
        lambda n: n["metadata"]["labels"].pop("nvidia.com/gpu.present"),
        OWN,
        "labels",
    ),
    "finalizer-removal": (gpu_pod(), lambda p: p["metadata"].pop("finalizers"), OWN, "finalizers"),
    "owner-change": (
        gpu_pod(),
        lambda p: p["metadata"]["ownerReferences"][0].update({"uid": "x"}),
        OWN,
        "owner references",
    ),
    "foreign-annotation-added": (
        gpu_pod(),
        lambda p: p["metadata"]["annotations"].update({"cluster-autoscaler.kubernetes.io/x": "1"}),
        OWN,
        "only annotations under",
    ),
    "foreign-annotation-changed": (
        gpu_pod(),
        lambda p: p["metadata"]["annotations"].update({"team.example/owner": "someone"}),
        OWN,
        "only annotations under",
    ),
    "foreign-annotation-removed": (
        gpu_pod(),
        lambda p: p["metadata"]["annotations"].pop("team.example/owner"),
        OWN,
        "only annotations under",
    ),
    "lookalike-domain": (
        gpu_pod(),
        lambda p: p["metadata"]["annotations"].update({f"{DEFAULT_DOMAIN}.evil.example/x": "1"}),
        OWN,
        "only annotations under",
    ),
}


@pytest.mark.parametrize("case", sorted(DENIED))
def test_the_profiler_is_denied(case: str) -> None:
    old, change, node, reason = DENIED[case]
    verdict = admit(POLICY, update(PROFILER, old, change, node=node))
    assert verdict.judged
    assert not verdict.allowed
    assert reason in verdict.message


def test_the_policy_follows_the_annotation_domain() -> None:
    policy = profiler_policy("gpu-profiler", "gpu-profiler", "gpu.example.org")
    mine = update(
        PROFILER,
        gpu_pod(),
        lambda p: p["metadata"]["annotations"].update(
            {"gpu.example.org/do-not-disrupt": "training", DO_NOT_DISRUPT: "true"}
        ),
    )
    assert admit(policy, mine).allowed
    # the default domain's annotation already on the pod is now a foreign one
    assert not admit(policy, update(PROFILER, gpu_pod(), protect)).allowed


# -- the trial runner ---------------------------------------------------------------------------

TRIALS = trial_policy(
    TRIAL_NAMESPACE, TRIAL_ACCOUNT, LABELS["app.kubernetes.io/managed-by"], LEASE_NAME
)


def golden(name: str) -> Json:
    manifest: Json = yaml.safe_load((DATA / f"{name}.yaml").read_text())
    return manifest


def anchor() -> Json:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "trial-run-0a1b2c3d",
            "namespace": TRIAL_NAMESPACE,
            "labels": {f"{DEFAULT_DOMAIN}/trial-run": "0a1b2c3d", MANAGED_BY[0]: MANAGED_BY[1]},
        },
        "data": {"source": "Job/ml/bert", "trials": "2"},
    }


def runner(operation: str, obj: Json) -> Json:
    if operation == "DELETE":
        return request(operation, user(TRIAL_RUNNER, OWN), old=obj)
    if operation == "UPDATE":  # the lock's renewal: the stored Lease, the renewed one
        renewed = changed(obj, lambda lease: lease["spec"].update(renewTime="2026-01-01T00:01:00Z"))
        return request(operation, user(TRIAL_RUNNER, OWN), old=obj, new=renewed)
    return request(operation, user(TRIAL_RUNNER, OWN), new=obj)


def run_lock() -> Json:
    """The Lease ``trial run`` takes, as its lock writes it (``NamespaceLock._manifest``)."""
    lock = NamespaceLock(cast(TrialCluster, None), TRIAL_NAMESPACE, "0a1b2c3d", lambda: 1.7e9)
    lease = lock._manifest()  # the manifest the lock sends, without a cluster
    lease["metadata"]["namespace"] = TRIAL_NAMESPACE
    return lease


def trial_pod() -> Json:
    """A pod of a trial Job, as the Job controller makes it: the template's labels."""
    template = golden("job-1-gpu")["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": "gpu-profiler-trial-0a1b2c3d-0-7xk2p",
            "namespace": TRIAL_NAMESPACE,
        },
        "spec": {**template["spec"], "nodeName": OWN},
    }


# RBAC verbs and the admission operations they reach (the API server's request operations).
OPERATION_OF = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}


def test_every_write_the_runners_role_grants_is_judged() -> None:
    """Each (group, resource, write verb) of the runner's Role falls within the policy's
    matchConstraints: no write of the runner reaches the API server unjudged."""
    uncovered = [
        (group, resource, verb)
        for group, resources, verbs in ROLE_RULES
        for resource in resources
        for verb in verbs
        if verb in OPERATION_OF
        and not any(
            group in rule["apiGroups"]
            and resource in rule["resources"]
            and OPERATION_OF[verb] in rule["operations"]
            for rule in TRIALS.rules
        )
    ]
    assert uncovered == []


def test_the_runner_label_is_the_one_trial_run_sets() -> None:
    assert dict([MANAGED_BY]) == LABELS


@pytest.mark.parametrize(
    ("operation", "obj"),
    [
        ("CREATE", golden("job-1-gpu")),
        ("CREATE", golden("pytorchjob-4-spread")),
        ("CREATE", anchor()),
        ("DELETE", golden("job-4-gpus")),
        ("DELETE", anchor()),
        ("DELETE", trial_pod()),
        ("CREATE", run_lock()),
        ("UPDATE", run_lock()),
        ("DELETE", run_lock()),
    ],
    ids=[
        "job",
        "pytorchjob",
        "anchor",
        "delete-job",
        "delete-anchor",
        "delete-trial-pod",
        "take-lock",
        "renew-lock",
        "release-lock",
    ],
)
def test_the_runner_makes_and_removes_its_own_objects(operation: str, obj: Json) -> None:
    verdict = admit(TRIALS, runner(operation, obj))
    assert verdict.judged
    assert verdict.allowed, verdict.message


def _as_runner(spec: Json) -> None:
    spec["serviceAccountName"] = TRIAL_ACCOUNT


TRIAL_DENIED: dict[str, tuple[str, Json, str]] = {
    "delete-root-ca": (
        "DELETE",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": TRIAL_NAMESPACE},
            "data": {"ca.crt": "..."},
        },
        "only objects labelled",
    ),
    "delete-other-pod": (
        "DELETE",
        changed(trial_pod(), lambda p: p["metadata"].update(labels={"app": "inference"})),
        "only objects labelled",
    ),
    "renew-other-lease": (
        "UPDATE",
        changed(run_lock(), lambda lease: lease["metadata"].update(name="kube-scheduler")),
        "writes no Lease but",
    ),
    "delete-other-lease": (
        "DELETE",
        changed(run_lock(), lambda lease: lease["metadata"].update(name="kube-scheduler")),
        "writes no Lease but",
    ),
    "take-other-lease": (
        "CREATE",
        changed(run_lock(), lambda lease: lease["metadata"].update(name="cnpg-leader")),
        "writes no Lease but",
    ),
    "unlabelled-configmap": (
        "CREATE",
        changed(anchor(), lambda c: c["metadata"].pop("labels")),
        "only objects labelled",
    ),
    "job-as-runner": (
        "CREATE",
        changed(golden("job-1-gpu"), lambda j: _as_runner(j["spec"]["template"]["spec"])),
        "may not run as",
    ),
    "pytorchjob-worker-as-runner": (
        "CREATE",
        changed(
            golden("pytorchjob-4-spread"),
            lambda j: _as_runner(j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]),
        ),
        "may not run as",
    ),
}


@pytest.mark.parametrize("case", sorted(TRIAL_DENIED))
def test_the_runner_is_denied(case: str) -> None:
    operation, obj, reason = TRIAL_DENIED[case]
    verdict = admit(TRIALS, runner(operation, obj))
    assert verdict.judged
    assert not verdict.allowed
    assert reason in verdict.message


# -- the SQLite store's namespace ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sqlite_run() -> ProgramRun:
    return run_stack(KUBEADM_STACK, overrides={"profilerStore": "sqlite"})


@pytest.fixture(scope="module")
def sqlite_pod(sqlite_run: ProgramRun) -> Json:
    """The profiler's pod as the DaemonSet controller creates it in SQLite mode."""
    template = sqlite_run.one("kubernetes:apps/v1:DaemonSet").get("spec.template")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": "gpu-profiler-x7k2p",
            "namespace": "gpu-profiler",
        },
        "spec": {**template["spec"], "nodeName": OWN},
    }


STORE_POLICY = store_namespace_policy("gpu-profiler", STORE_DIR, SQLITE_INIT_CAPABILITIES)
DAEMON_SET_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"


def create(pod: Json) -> Json:
    return request("CREATE", user(DAEMON_SET_CONTROLLER), new=pod)


def test_the_profilers_own_pod_is_admitted(sqlite_pod: Json) -> None:
    verdict = admit(STORE_POLICY, create(sqlite_pod))
    assert verdict.judged
    assert verdict.allowed, verdict.message


def _container(pod: Json) -> Json:
    container: Json = pod["spec"]["containers"][0]
    return container


STORE_DENIED: dict[str, tuple[Callable[[Json], Any], str]] = {
    "another-host-path": (
        lambda p: p["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        "the only hostPath",
    ),
    "host-network": (lambda p: p["spec"].update({"hostNetwork": True}), "host's network"),
    "privileged": (
        lambda p: _container(p)["securityContext"].update({"privileged": True}),
        "drop ALL capabilities",
    ),
    "escalation": (
        lambda p: _container(p)["securityContext"].update({"allowPrivilegeEscalation": True}),
        "never escalate",
    ),
    "host-port": (
        lambda p: _container(p)["ports"][0].update({"hostPort": 9401}),
        "no host port",
    ),
    "root-container": (
        lambda p: _container(p)["securityContext"].update({"runAsUser": 0, "runAsNonRoot": False}),
        "run as non-root",
    ),
    "capability-added": (
        lambda p: _container(p)["securityContext"]["capabilities"].update({"add": ["NET_ADMIN"]}),
        "add no capability",
    ),
    "init-sys-admin": (
        lambda p: p["spec"]["initContainers"][0]["securityContext"]["capabilities"].update(
            {"add": ["CHOWN", "SYS_ADMIN"]}
        ),
        "init containers",
    ),
}


@pytest.mark.parametrize("case", sorted(STORE_DENIED))
def test_anything_more_in_the_namespace_is_denied(sqlite_pod: Json, case: str) -> None:
    change, reason = STORE_DENIED[case]
    verdict = admit(STORE_POLICY, create(changed(sqlite_pod, change)))
    assert verdict.judged
    assert not verdict.allowed
    assert reason in verdict.message


def test_the_namespace_is_privileged_only_with_the_policy_bound(sqlite_run: ProgramRun) -> None:
    labels = sqlite_run.one("kubernetes:core/v1:Namespace", "profiler-namespace").get(
        "metadata.labels"
    )
    assert labels == {
        "pod-security.kubernetes.io/enforce": "privileged",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/audit": "restricted",
    }
    admission = "kubernetes:admissionregistration.k8s.io/v1"
    policies = {
        p.get("metadata.name"): p.get("spec")
        for p in sqlite_run.of_type(f"{admission}:ValidatingAdmissionPolicy")
    }
    assert policies[STORE_POLICY.name] == STORE_POLICY.spec()
    bindings = [
        b.get("spec.policyName")
        for b in sqlite_run.of_type(f"{admission}:ValidatingAdmissionPolicyBinding")
    ]
    assert STORE_POLICY.name in bindings


def test_pods_of_other_namespaces_are_not_judged(sqlite_pod: Json) -> None:
    elsewhere = changed(sqlite_pod, lambda p: p["metadata"].update({"namespace": "ml"}))
    elsewhere["spec"]["hostNetwork"] = True
    assert not admit(STORE_POLICY, create(elsewhere)).judged
