"""Both stacks render the profiler's admission policy and its binding (the trial runner's too when
it is on), generated from the stack's annotation domain, and the ``admission`` check fails when a
writing identity has none.

Test double: Pulumi's mock engine and the charts rendered by Helm instead of a cluster.
"""

from __future__ import annotations

import copy

import pytest

from infra.admission import profiler_policy, trial_policy
from infra.render.checks.admission import admission_findings
from infra.render.graph import ObjectGraph, build_graph
from infra.render.program import run_stack
from infra.trials import LABELS, TRIAL_ACCOUNT, TRIAL_NAMESPACE
from profiler_app.core.annotations import DEFAULT_DOMAIN
from profiler_app.trial.lock import LEASE_NAME
from tests.infra.conftest import EKS_STACK

pytestmark = pytest.mark.charts

PROFILER_POLICY = profiler_policy("gpu-profiler", "gpu-profiler", DEFAULT_DOMAIN)


def policy_and_binding(graph: ObjectGraph, name: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    policy = graph.find("ValidatingAdmissionPolicy", name)
    binding = graph.find("ValidatingAdmissionPolicyBinding", name)
    assert policy is not None, f"no ValidatingAdmissionPolicy {name}"
    assert binding is not None, f"no ValidatingAdmissionPolicyBinding {name}"
    return policy.manifest, binding.manifest


@pytest.mark.parametrize("stack", ["eks", "kubeadm"])
def test_both_stacks_bind_the_profilers_policy(
    stack: str, eks_graph: ObjectGraph, kubeadm_graph: ObjectGraph
) -> None:
    graph = eks_graph if stack == "eks" else kubeadm_graph
    policy, binding = policy_and_binding(graph, PROFILER_POLICY.name)
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"] == PROFILER_POLICY.spec()
    assert binding["spec"] == {"policyName": PROFILER_POLICY.name, "validationActions": ["Deny"]}
    assert admission_findings(graph) == []


def test_the_policy_follows_the_stacks_annotation_domain() -> None:
    domain = "gpu.example.org"
    graph = build_graph(run_stack(EKS_STACK, overrides={"annotationDomain": domain}))
    policy, _ = policy_and_binding(graph, PROFILER_POLICY.name)
    assert policy["spec"] == profiler_policy("gpu-profiler", "gpu-profiler", domain).spec()
    assert f"'{domain}/'" in str(policy["spec"]["validations"])
    assert f"'{DEFAULT_DOMAIN}/'" not in str(policy["spec"]["validations"])


def test_the_trial_runner_gets_its_policy() -> None:
    graph = build_graph(run_stack(EKS_STACK, overrides={"trialRunner": {"maxGpus": 4}}))
    expected = trial_policy(
        TRIAL_NAMESPACE, TRIAL_ACCOUNT, LABELS["app.kubernetes.io/managed-by"], LEASE_NAME
    )
    policy, _ = policy_and_binding(graph, expected.name)
    assert policy["spec"] == expected.spec()
    assert admission_findings(graph) == []


def test_a_writing_identity_without_a_policy_is_a_finding(eks_graph: ObjectGraph) -> None:
    graph = copy.deepcopy(eks_graph)
    graph.objects = [o for o in graph.objects if o.kind != "ValidatingAdmissionPolicyBinding"]
    (finding,) = admission_findings(graph)
    assert "system:serviceaccount:gpu-profiler:gpu-profiler may write" in finding
    audit_only = copy.deepcopy(eks_graph)
    for obj in audit_only.of_kind("ValidatingAdmissionPolicyBinding"):
        obj.manifest["spec"]["validationActions"] = ["Audit"]
    assert len(admission_findings(audit_only)) == 1
