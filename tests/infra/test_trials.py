"""GpuTrialRunner under Pulumi mocks: off unless asked; the trial namespace with its quota and
PriorityClass; a Role limited to that namespace and exactly what ``trial run`` does; the Job of
docs/trial.md that runs it with that ServiceAccount is a valid object.

Test double: Pulumi's mock engine instead of a Kubernetes API server.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pulumi
import pytest
import yaml

from infra.render.program import ProgramRun, run_stack
from infra.trials import PRIORITY_CLASS, QUOTA_NAME, TRIAL_ACCOUNT, TRIAL_NAMESPACE
from infra.versions import KUBERNETES_VERSION
from profiler_app.trial import guards, run_options
from tests.infra.conftest import EKS_STACK, REPO_ROOT

RBAC = "kubernetes:rbac.authorization.k8s.io/v1"


@pytest.fixture(scope="module")
def trial_run() -> ProgramRun:
    return run_stack(EKS_STACK, overrides={"trialRunner": {"maxGpus": 4, "maxTrials": 2}})


def test_off_by_default(eks_run: ProgramRun) -> None:
    assert eks_run.of_type(f"{RBAC}:Role") == []
    assert eks_run.of_type("kubernetes:scheduling.k8s.io/v1:PriorityClass") == []


def test_the_role_is_the_namespace_and_what_trial_run_does(trial_run: ProgramRun) -> None:
    role = trial_run.one(f"{RBAC}:Role").inputs
    assert role["metadata"]["namespace"] == TRIAL_NAMESPACE
    rules = {(r["apiGroups"][0], r["resources"][0]): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        ("batch", "jobs"): ["create", "delete", "get", "list"],
        ("kubeflow.org", "pytorchjobs"): ["create", "delete", "get", "list"],
        ("", "pods"): ["delete", "get", "list", "watch"],
        ("", "pods/log"): ["get"],
        ("", "configmaps"): ["create", "delete", "get", "list"],
        ("", "resourcequotas"): ["get"],
        ("coordination.k8s.io", "leases"): ["create", "delete", "get", "update"],
        ("", "events"): ["list"],
    }
    binding = trial_run.one(f"{RBAC}:RoleBinding").inputs
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": TRIAL_ACCOUNT,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": TRIAL_ACCOUNT, "namespace": TRIAL_NAMESPACE}
    ]
    # Cluster-wide, the runner may only read its own PriorityClass (to check it).
    roles = [r for r in trial_run.of_type(f"{RBAC}:ClusterRole") if "trial" in r.name]
    assert [r.inputs["rules"] for r in roles] == [
        [
            {
                "apiGroups": ["scheduling.k8s.io"],
                "resources": ["priorityclasses"],
                "resourceNames": [PRIORITY_CLASS],
                "verbs": ["get"],
            }
        ]
    ]


def test_the_guards_the_runner_finds_in_place(trial_run: ProgramRun) -> None:
    quota = trial_run.one("kubernetes:core/v1:ResourceQuota").inputs
    assert quota["metadata"]["name"] == QUOTA_NAME == guards.QUOTA_NAME
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "4"
    assert quota["spec"]["hard"]["count/jobs.batch"] == "2"
    priority = trial_run.one("kubernetes:scheduling.k8s.io/v1:PriorityClass").inputs
    assert priority["metadata"]["name"] == PRIORITY_CLASS == run_options.PRIORITY_CLASS
    assert priority["preemptionPolicy"] == "Never"
    assert priority["value"] == guards.PRIORITY_VALUE < 0
    namespace = [
        n.inputs
        for n in trial_run.of_type("kubernetes:core/v1:Namespace")
        if n.inputs["metadata"]["name"] == TRIAL_NAMESPACE
    ]
    assert namespace[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"maxGPUs": 4}, "unknown keys maxGPUs"),
        ({"maxGpus": 0}, "at least 1"),
        ({"maxGpus": "many"}, "whole number"),
    ],
)
def test_bad_config_is_one_line(value: Any, message: str) -> None:
    with pytest.raises(pulumi.RunError, match=message):
        run_stack(EKS_STACK, overrides={"trialRunner": value})


def test_the_documented_in_cluster_job_is_valid_and_uses_the_account() -> None:
    text = (REPO_ROOT / "docs" / "trial.md").read_text()
    block = re.search(r"```yaml\n(# trial-run-job\n.*?)```", text, re.S)
    assert block is not None
    documents = [d for d in yaml.safe_load_all(block.group(1)) if d]
    job = next(d for d in documents if d["kind"] == "Job")
    for document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    spec = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == TRIAL_NAMESPACE
    assert spec["serviceAccountName"] == TRIAL_ACCOUNT
    (container,) = spec["containers"]
    assert container["command"][:3] == ["gpu-profiler", "trial", "run"]
    assert job["spec"]["backoffLimit"] == 0


def test_the_account_trials_refuse_is_the_one_the_stacks_give_the_runner() -> None:
    """``trial`` refuses a template whose pods run as the runner's ServiceAccount: the name it
    refuses is the one this component creates (here: it needs Pulumi, which tests/unit lacks)."""
    from profiler_app.trial.manifests import TRIAL_RUNNER_ACCOUNT  # noqa: PLC0415

    assert TRIAL_RUNNER_ACCOUNT == TRIAL_ACCOUNT
