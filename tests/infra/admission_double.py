"""A test double of the API server's ValidatingAdmissionPolicy admission, on cel-python.

What it does as the API server does (kubernetes/kubernetes, as stored at the search index,
release 1.35 line):

- ``staging/src/k8s.io/apiserver/pkg/admission/plugin/cel/compile.go``: the variables an
  expression sees: ``object``, ``oldObject`` (null on CREATE and DELETE respectively), ``request``
  (``BuildRequestType``: ``kind``, ``resource``, ``subResource``, ``name``, ``namespace``,
  ``operation``, ``userInfo`` with ``username``, ``uid``, ``groups``, ``extra`` as
  map(string, list(string)), ``dryRun``, ``options``) and ``variables``;
- ``staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/``: a request outside
  ``matchConstraints`` or failing a ``matchCondition`` is not judged; a validation that is false
  denies with its message; one that errors takes ``failurePolicy`` (``Fail`` here: denied);
- ``staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go``: a pod-bound token's
  user info carries ``authentication.kubernetes.io/node-name`` (``ServiceAccountInfo.UserInfo``),
  on from 1.30 and locked on from 1.32 (``ServiceAccountTokenPodNodeInfo`` in
  ``pkg/features/kube_features.go``).

What it does not do, and a real API server adds: type-checking each expression against the
objects' OpenAPI schemas when the policy is created, the static cost estimate and the per-call
cost limit, lazy evaluation of ``variables``, the Kubernetes CEL extension libraries (unused by
the policies), and the binding's ``matchResources`` and ``paramRef`` (unused too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import celpy

from infra.admission import AdmissionPolicy

Json = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    judged: bool  # False: the policy does not apply to the request
    message: str = ""


def _rule_matches(rule: Json, request: Json) -> bool:
    resource = request["resource"]
    return (
        request["operation"] in rule["operations"]
        and resource["group"] in rule["apiGroups"]
        and ("*" in rule["apiVersions"] or resource["version"] in rule["apiVersions"])
        and resource["resource"] in rule["resources"]
        and not request.get("subResource")
    )


def _evaluate(expression: str, activation: Json) -> Any:
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    return program.evaluate(activation)


def admit(policy: AdmissionPolicy, request: Json) -> Verdict:  # noqa: PLR0911  one per outcome
    """The policy's verdict on ``request`` (an AdmissionRequest with ``object`` and
    ``oldObject``), as ValidatingAdmissionPolicy admission reaches it."""
    spec = policy.spec()
    constraints = spec["matchConstraints"]
    if not any(_rule_matches(rule, request) for rule in constraints["resourceRules"]):
        return Verdict(allowed=True, judged=False)
    # namespaceSelector: the namespace's labels, of which the API server sets its name's
    selector = constraints.get("namespaceSelector", {}).get("matchLabels", {})
    if selector and selector != {"kubernetes.io/metadata.name": request.get("namespace")}:
        return Verdict(allowed=True, judged=False)
    view = {key: value for key, value in request.items() if key not in ("object", "oldObject")}
    activation: Json = {
        "object": celpy.json_to_cel(request.get("object")),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
        "request": celpy.json_to_cel(view),
    }
    try:
        for condition in spec.get("matchConditions", []):
            if not _evaluate(condition["expression"], activation):
                return Verdict(allowed=True, judged=False)
        variables = {}
        for variable in spec.get("variables", []):
            variables[variable["name"]] = _evaluate(
                variable["expression"], {**activation, "variables": variables}
            )
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        for validation in spec["validations"]:
            result = _evaluate(validation["expression"], activation)
            if not isinstance(result, celpy.celtypes.BoolType):
                return Verdict(False, True, f"not a bool: {validation['expression']}")
            if not result:
                return Verdict(False, True, validation["message"])
    except celpy.CELEvalError as error:  # failurePolicy: Fail
        return Verdict(False, True, f"evaluation error: {error}")
    return Verdict(allowed=True, judged=True)


def user(username: str, node: str | None = None) -> Json:
    """``request.userInfo`` as the API server builds it; for a ServiceAccount's pod-bound
    token, with the pod's and (``node``) the node's claims."""
    info: Json = {"username": username, "uid": "5d1c9a2e-0000-4000-8000-000000000001"}
    if username.startswith("system:serviceaccount:"):
        namespace = username.split(":")[2]
        info["groups"] = [
            "system:serviceaccounts",
            f"system:serviceaccounts:{namespace}",
            "system:authenticated",
        ]
    else:
        info["groups"] = ["system:masters", "system:authenticated"]
    if node is not None:
        info["extra"] = {
            "authentication.kubernetes.io/pod-name": ["gpu-profiler-x7k2p"],
            "authentication.kubernetes.io/pod-uid": ["0f3c1e7a-0000-4000-8000-000000000002"],
            "authentication.kubernetes.io/node-name": [node],
            "authentication.kubernetes.io/node-uid": ["7b2d4c1e-0000-4000-8000-000000000003"],
            "authentication.kubernetes.io/credential-id": ["JTI=9a8b7c6d"],
        }
    return info


_GROUP_VERSIONS = {
    "Pod": ("", "v1", "pods"),
    "Node": ("", "v1", "nodes"),
    "ConfigMap": ("", "v1", "configmaps"),
    "Job": ("batch", "v1", "jobs"),
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "Lease": ("coordination.k8s.io", "v1", "leases"),
}


def request(
    operation: str, user_info: Json, *, old: Json | None = None, new: Json | None = None
) -> Json:
    """An AdmissionRequest for ``operation`` of ``old`` into ``new``."""
    subject = new if new is not None else old
    assert subject is not None
    group, version, resource = _GROUP_VERSIONS[subject["kind"]]
    metadata = subject["metadata"]
    built: Json = {
        "kind": {"group": group, "version": version, "kind": subject["kind"]},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": subject["kind"]},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": metadata["name"],
        "operation": operation,
        "userInfo": user_info,
        "dryRun": False,
        "object": copy.deepcopy(new),
        "oldObject": copy.deepcopy(old),
    }
    if "namespace" in metadata:
        built["namespace"] = metadata["namespace"]
    return built
