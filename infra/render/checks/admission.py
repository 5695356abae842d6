"""The ``admission`` check: every identity of the project that may write gets an admission policy.

RBAC says which kinds an identity may write, not which objects; infra/admission.py narrows that
with ValidatingAdmissionPolicies. This check finds each ServiceAccount that the project's own
objects (not a chart's, nor an upstream manifest's: ``UPSTREAM_ACCOUNTS``) bind to a role with
a write verb, and asks for a policy whose match condition names it and a binding that denies
with that policy. An identity added later without
one fails the render instead of reaching a cluster unchecked.
"""

from __future__ import annotations

from collections.abc import Iterator

from infra.admission import service_account_user
from infra.render.graph import K8sObject, ObjectGraph
from infra.storage import LOCAL_PATH_ACCOUNT, LOCAL_PATH_NAMESPACE

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection", "*"})
# Upstream components the stacks create from their publishers' manifests rather than a chart:
# their identities are upstream's, as a chart's are, and the project writes nothing through them.
UPSTREAM_ACCOUNTS = {
    service_account_user(LOCAL_PATH_NAMESPACE, LOCAL_PATH_ACCOUNT): (
        "rancher/local-path-provisioner v0.0.37's controller, bound as its release manifest "
        "binds it (infra/storage.py)"
    ),
}


def _role(graph: ObjectGraph, binding: K8sObject) -> K8sObject | None:
    ref = binding.manifest.get("roleRef") or {}
    kind = str(ref.get("kind"))
    namespace = binding.namespace if kind == "Role" else None
    return graph.find(kind, str(ref.get("name")), namespace)


def _writes(role: K8sObject) -> bool:
    return any(
        WRITE_VERBS & set(rule.get("verbs") or []) for rule in role.manifest.get("rules") or []
    )


def writing_accounts(graph: ObjectGraph) -> dict[str, K8sObject]:
    """User names of the ServiceAccounts the project's own bindings let write, with a binding."""
    found: dict[str, K8sObject] = {}
    for binding in graph.of_kind("RoleBinding", "ClusterRoleBinding"):
        if binding.source.startswith("helm/"):
            continue
        role = _role(graph, binding)
        if role is None or not _writes(role):
            continue
        for subject in binding.manifest.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                namespace = str(subject.get("namespace") or binding.namespace)
                found[service_account_user(namespace, str(subject["name"]))] = binding
    return found


def _denying_policies(graph: ObjectGraph) -> set[str]:
    return {
        str((binding.manifest.get("spec") or {}).get("policyName"))
        for binding in graph.of_kind("ValidatingAdmissionPolicyBinding")
        if "Deny" in ((binding.manifest.get("spec") or {}).get("validationActions") or [])
    }


def _guarded_users(graph: ObjectGraph) -> Iterator[str]:
    denying = _denying_policies(graph)
    for policy in graph.of_kind("ValidatingAdmissionPolicy"):
        if policy.name not in denying:
            continue
        spec = policy.manifest.get("spec") or {}
        if spec.get("failurePolicy", "Fail") != "Fail" or not spec.get("validations"):
            continue
        for condition in spec.get("matchConditions") or []:
            expression = str(condition.get("expression", ""))
            prefix = "request.userInfo.username == '"
            if expression.startswith(prefix) and expression.endswith("'"):
                yield expression[len(prefix) : -1]


def admission_findings(graph: ObjectGraph) -> list[str]:
    """A finding for each writing ServiceAccount of the project without a denying policy."""
    guarded = set(_guarded_users(graph))
    return [
        f"{binding}: {user} may write, and no ValidatingAdmissionPolicy bound with Deny "
        "(failurePolicy Fail) matches it (infra/admission.py)"
        for user, binding in sorted(writing_accounts(graph).items())
        if user not in guarded and user not in UPSTREAM_ACCOUNTS
    ]
