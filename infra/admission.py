"""ValidatingAdmissionPolicies: what the API server itself enforces on the project's identities.

RBAC can grant ``patch`` on every pod and node, not "annotations of the pods on my node". The
profiler's code limits itself to its own node; these policies make the API server hold it to that,
as the NodeRestriction plugin does for kubelets (``admissionregistration.k8s.io/v1``, GA in 1.30):

- the profiler (``profiler_policy``): an update by its ServiceAccount must target its own node,
  or a pod bound to it: the node named by the request's ``authentication.kubernetes.io/node-name``
  claim, which the API server puts in a pod-bound token's user info
  (``ServiceAccountTokenPodNodeInfo``, locked on since 1.32). Spec, labels, finalizers and owner
  references stay as they were; only annotation keys under the annotation domain and
  ``karpenter.sh/do-not-disrupt`` may change.
  A token not bound to a pod (``kubectl create token``) has no claim and is refused.
- the trial runner (``trial_policy``): it creates and deletes only objects labelled as its own
  (trials, their anchor ConfigMaps, their pods: on DELETE the object is ``oldObject``), writes no
  Lease but its run lock, and no pod it starts runs as the runner's ServiceAccount (a trial would
  get the runner's rights).
- the SQLite store's namespace (``store_namespace_policy``): Pod Security ``privileged`` for its
  hostPath, narrowed back by a policy to that one exception.

``gpu-profiler unprotect`` runs with the credentials of the person or of ``pulumi destroy`` (the
stack's kubeconfig), which the bindings do not match: it still removes marks cluster-wide.

Expressions keep to standard CEL (``has``, ``all``, ``exists``, ``in``, ``startsWith``), no
Kubernetes extension library, so tests/infra/test_admission.py evaluates them with cel-python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


@dataclass(frozen=True)
class Check:
    expression: str
    message: str


@dataclass(frozen=True)
class AdmissionPolicy:
    """One ValidatingAdmissionPolicy and what its binding needs."""

    name: str
    username: str | None  # the ServiceAccount's user name the policy applies to; None: anyone
    rules: tuple[dict[str, Any], ...]  # matchConstraints.resourceRules
    variables: tuple[tuple[str, str], ...]
    validations: tuple[Check, ...]
    namespace: str | None = None  # only requests in this namespace; None: every namespace

    def spec(self) -> dict[str, Any]:
        """The policy's spec, as the API server takes it."""
        constraints: dict[str, Any] = {"resourceRules": [dict(rule) for rule in self.rules]}
        if self.namespace is not None:
            constraints["namespaceSelector"] = {
                "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
            }
        spec: dict[str, Any] = {"failurePolicy": "Fail", "matchConstraints": constraints}
        if self.username is not None:
            condition = f"request.userInfo.username == '{self.username}'"
            spec["matchConditions"] = [{"name": "service-account", "expression": condition}]
        if self.variables:
            spec["variables"] = [{"name": n, "expression": e} for n, e in self.variables]
        spec["validations"] = [
            {"expression": check.expression, "message": check.message} for check in self.validations
        ]
        return spec


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _unchanged(path: str) -> str:
    """``object.<path>`` equals ``oldObject.<path>``; an absent field equals only an absent one."""
    return (
        f"has(object.{path}) == has(oldObject.{path}) && "
        f"(!has(object.{path}) || object.{path} == oldObject.{path})"
    )


def profiler_policy(namespace: str, account: str, domain: str) -> AdmissionPolicy:
    """The profiler may change annotations under ``domain`` and do-not-disrupt, on its own node
    and the pods bound to it, and nothing else of theirs."""
    prefix = f"{domain}/"
    allowed = f"(k.startsWith('{prefix}') || k == '{DO_NOT_DISRUPT}')"
    old, new = "oldObject.metadata.annotations", "object.metadata.annotations"
    return AdmissionPolicy(
        name=f"{account}-own-node",
        username=service_account_user(namespace, account),
        rules=(
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["UPDATE"],
                "resources": ["pods", "nodes"],
            },
        ),
        variables=(
            (
                "claimedNode",
                f"has(request.userInfo.extra) && '{NODE_NAME_CLAIM}' in request.userInfo.extra "
                f"&& size(request.userInfo.extra['{NODE_NAME_CLAIM}']) == 1 "
                f"? request.userInfo.extra['{NODE_NAME_CLAIM}'][0] : ''",
            ),
            (
                "targetNode",
                "request.resource.resource == 'nodes' ? oldObject.metadata.name "
                ": (has(oldObject.spec.nodeName) ? oldObject.spec.nodeName : '')",
            ),
        ),
        validations=(
            Check(
                "variables.claimedNode != '' && variables.targetNode == variables.claimedNode",
                f"{account} may change only its own node and the pods bound to it "
                f"(the token's {NODE_NAME_CLAIM})",
            ),
            Check(
                _unchanged("spec"),
                f"{account} may not change a pod's or node's spec (images, taints, ...)",
            ),
            Check(
                " && ".join(
                    _unchanged(f"metadata.{field}")
                    for field in ("labels", "finalizers", "ownerReferences")
                ),
                f"{account} may not change labels, finalizers or owner references",
            ),
            Check(
                f"(!has({new}) || {new}.all(k, {allowed} || "
                f"(has({old}) && k in {old} && {old}[k] == {new}[k]))) && "
                f"(!has({old}) || {old}.all(k, {allowed} || (has({new}) && k in {new})))",
                f"{account} may add, change or remove only annotations under {prefix} "
                f"and {DO_NOT_DISRUPT}",
            ),
        ),
    )


# The pod templates of what the trial runner creates: a Job's, and each PyTorchJob replica's.
_JOB_ACCOUNT = "object.spec.template.spec"
_REPLICAS = "object.spec.pytorchReplicaSpecs"


def _not_account(pod_spec: str, account: str) -> str:
    return " && ".join(
        f"(!has({pod_spec}.{field}) || {pod_spec}.{field} != '{account}')"
        for field in ("serviceAccountName", "serviceAccount")
    )


def trial_policy(namespace: str, account: str, managed_by: str, lease: str) -> AdmissionPolicy:
    """The trial runner creates, deletes (and, for its Lease ``lease``, updates) only objects
    labelled ``managed_by``, writes no other Lease, and no pod it starts runs as ``account``."""
    label = f"'{MANAGED_BY_LABEL}'"

    def labelled(obj: str) -> str:
        return (
            f"has({obj}.metadata.labels) && {label} in {obj}.metadata.labels && "
            f"{obj}.metadata.labels[{label}] == '{managed_by}'"
        )

    replica = f"{_REPLICAS}[r].template.spec"
    return AdmissionPolicy(
        name=f"{account}-own-objects",
        username=service_account_user(namespace, account),
        rules=(
            {
                "apiGroups": ["batch"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "DELETE"],
                "resources": ["jobs"],
            },
            {
                "apiGroups": ["kubeflow.org"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "DELETE"],
                "resources": ["pytorchjobs"],
            },
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "DELETE"],
                "resources": ["configmaps"],
            },
            # Its RBAC deletes pods (a trial's, with a short grace) and writes its run lock.
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["DELETE"],
                "resources": ["pods"],
            },
            {
                "apiGroups": ["coordination.k8s.io"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["leases"],
            },
        ),
        variables=(),
        validations=(
            Check(
                f"request.operation == 'DELETE' ? ({labelled('oldObject')}) "
                f": ({labelled('object')})",
                f"{account} writes and deletes only objects labelled "
                f"{MANAGED_BY_LABEL}={managed_by}",
            ),
            Check(
                "request.resource.resource != 'leases' || (request.operation == 'DELETE' "
                f"? oldObject.metadata.name : object.metadata.name) == '{lease}'",
                f"{account} writes no Lease but {lease}",
            ),
            Check(
                "request.operation == 'DELETE' || "
                f"(request.resource.resource == 'jobs' ? ({_not_account(_JOB_ACCOUNT, account)}) "
                f": request.resource.resource == 'pytorchjobs' ? (!has({_REPLICAS}) || "
                f"{_REPLICAS}.all(r, {_not_account(replica, account)})) : true)",
                f"a trial's pods may not run as {account}",
            ),
        ),
    )


def _containers(pod_spec: str, kind: str, check: str) -> str:
    return f"!has({pod_spec}.{kind}) || {pod_spec}.{kind}.all(c, {check})"


def store_namespace_policy(
    namespace: str, store_dir: str, init_caps: tuple[str, ...]
) -> AdmissionPolicy:
    """The one exception the SQLite store needs, and nothing more, for every pod of ``namespace``
    (whose Pod Security level must be ``privileged`` for a hostPath): ``store_dir`` as the only
    hostPath; no host namespaces or ports; no privileged container or privilege escalation;
    every container drops ALL capabilities and runs as non-root, but init containers, which may
    run as root with ``init_caps`` added."""
    spec = "object.spec"
    context = "c.securityContext"
    no_escalation = (
        f"has({context}) && has({context}.allowPrivilegeEscalation) && "
        f"!{context}.allowPrivilegeEscalation && "
        f"(!has({context}.privileged) || !{context}.privileged) && "
        f"has({context}.capabilities) && has({context}.capabilities.drop) && "
        f"'ALL' in {context}.capabilities.drop && "
        f"(!has(c.ports) || c.ports.all(p, !has(p.hostPort) || p.hostPort == 0))"
    )
    allowed_caps = "[" + ", ".join(f"'{cap}'" for cap in init_caps) + "]"
    non_root = (
        f"((has({context}.runAsNonRoot) && {context}.runAsNonRoot) || "
        f"(has({spec}.securityContext) && has({spec}.securityContext.runAsNonRoot) && "
        f"{spec}.securityContext.runAsNonRoot && !has({context}.runAsUser)))"
    )
    return AdmissionPolicy(
        name=f"{namespace}-sqlite-store-pods",
        username=None,
        namespace=namespace,
        rules=(
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["pods"],
            },
        ),
        variables=(),
        validations=(
            Check(
                f"!has({spec}.volumes) || {spec}.volumes.all(v, !has(v.hostPath) || "
                f"(v.hostPath.path == '{store_dir}' && has(v.hostPath.type) && "
                "v.hostPath.type == 'DirectoryOrCreate'))",
                f"the only hostPath a pod of {namespace} may mount is {store_dir}",
            ),
            Check(
                " && ".join(
                    f"(!has({spec}.{field}) || !{spec}.{field})"
                    for field in ("hostNetwork", "hostPID", "hostIPC")
                ),
                f"pods of {namespace} may not use the host's network, PID or IPC namespace",
            ),
            Check(
                f"({_containers(spec, 'containers', no_escalation)}) && "
                f"({_containers(spec, 'initContainers', no_escalation)}) && "
                f"!has({spec}.ephemeralContainers)",
                f"containers of {namespace} drop ALL capabilities, never escalate, no host port",
            ),
            Check(
                _containers(
                    spec,
                    "containers",
                    f"{non_root} && (!has({context}.capabilities.add) || "
                    f"size({context}.capabilities.add) == 0)",
                ),
                f"containers of {namespace} run as non-root and add no capability",
            ),
            Check(
                _containers(
                    spec,
                    "initContainers",
                    f"!has({context}.capabilities.add) || "
                    f"{context}.capabilities.add.all(cap, cap in {allowed_caps})",
                ),
                f"init containers of {namespace} add no capability but {', '.join(init_caps)}",
            ),
        ),
    )


def admission_objects(
    policy: AdmissionPolicy, labels: dict[str, str], opts: pulumi.ResourceOptions
) -> Sequence[pulumi.Resource]:
    """The policy and its binding (deny on failure; the binding waits for the policy)."""
    created = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
        f"{policy.name}-policy",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=policy.name, labels=labels),
        # The API's own camelCase spec (what the tests evaluate), which the provider sends as is;
        # its typed dicts are spelt in snake_case.
        spec=cast(Any, policy.spec()),
        opts=opts,
    )
    binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
        f"{policy.name}-policy-binding",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=policy.name, labels=labels),
        spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
            policy_name=policy.name, validation_actions=["Deny"]
        ),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[created])),
    )
    return [created, binding]
