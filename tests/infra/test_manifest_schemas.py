"""Every Kubernetes object the components create directly, validated against real schemas.

Built-in kinds: kubernetes-validate's OpenAPI schemas of the targeted Kubernetes version, strict
(unknown fields are errors). CRD kinds (ServiceMonitor, PrometheusRule): the openAPIV3Schema of
prometheus-operator's CRDs (tests/infra/schemas/, descriptions removed; source and version noted
in each file), with unknown fields made errors as the API server's strict field validation does.
The objects come from the stacks run under Pulumi mocks (a test double for the API server).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest

from infra import versions
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK
from infra.render.program import ProgramRun, run_stack

SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitors.v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrules.v1.json",
}
KUBERNETES_VERSION = f"{versions.KUBERNETES_VERSION}.0"


def _closed(schema: Any) -> Any:
    """Objects with declared properties reject others (strict field validation)."""
    if isinstance(schema, dict):
        closed = {key: _closed(value) for key, value in schema.items()}
        if (
            "properties" in closed
            and "additionalProperties" not in closed
            and not closed.get("x-kubernetes-preserve-unknown-fields")
        ):
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    return schema


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    document = json.loads((SCHEMAS / CRD_SCHEMAS[(api_version, kind)]).read_text())
    assert document["kind"] == kind
    schema = _closed(document["openAPIV3Schema"])
    # metadata is validated by the API server, not by the CRD schema.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def validate(manifest: dict[str, Any]) -> None:
    key = (manifest["apiVersion"], manifest["kind"])
    if key in CRD_SCHEMAS:
        errors = sorted(crd_validator(*key).iter_errors(manifest), key=str)
        assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def stack_runs() -> list[tuple[str, ProgramRun]]:
    return [
        ("eks", run_stack(EKS_STACK)),
        ("kubeadm", run_stack(KUBEADM_STACK)),
        # Node label patches exist only for listed nodes.
        (
            "kubeadm-with-gpu-node-names",
            run_stack(KUBEADM_STACK, overrides={"gpuNodeNames": ["gpu-1"]}),
        ),
        (
            "eks-with-options",
            run_stack(
                EKS_STACK,
                overrides={"grafanaIngressHost": "grafana.example.org"},
                secrets={"profilerStoreUrl": "postgresql+psycopg://p:x@db/p"},
            ),
        ),
    ]


@pytest.fixture(scope="module")
def manifests() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{label}:{m['kind']}/{m['metadata']['name']}", m)
        for label, run in stack_runs()
        for m in run.kubernetes_objects()
    ]


def test_all_kinds_are_covered(manifests: list[tuple[str, dict[str, Any]]]) -> None:
    kinds = {m["kind"] for _, m in manifests}
    assert kinds == {
        "Namespace",
        "Secret",
        "ConfigMap",
        "PrometheusRule",
        "HorizontalPodAutoscaler",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Service",
        "ServiceMonitor",
        "NetworkPolicy",
        "Node",  # kubeadm's GPU label patches
    }


def test_every_object_is_valid(manifests: list[tuple[str, dict[str, Any]]]) -> None:
    failures = []
    for name, manifest in manifests:
        try:
            validate(manifest)
        except (AssertionError, kubernetes_validate.ValidationError) as error:
            failures.append(f"{name}: {error}")
    assert not failures, "\n".join(failures)


def test_dcgm_exporter_service_monitor_values_fit_the_crd(eks_run: ProgramRun) -> None:
    """The chart copies serviceMonitor.relabelings into its ServiceMonitor's endpoint."""
    values = eks_run.release("dcgm-exporter").inputs["values"]["serviceMonitor"]
    endpoint = {
        "port": "metrics",
        "interval": values["interval"],
        "honorLabels": values["honorLabels"],
        "relabelings": values["relabelings"],
    }
    validate(
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "dcgm-exporter"},
            "spec": {"selector": {}, "endpoints": [endpoint]},
        }
    )


@pytest.mark.parametrize(
    "broken",
    [
        # A typo in a built-in kind.
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "x"},
            "spec": {"clusterIp": "None"},
        },
        # A wrong type in a built-in kind.
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "x"},
            "spec": {"selector": {}, "template": {"spec": {"containers": "nope"}}},
        },
        # An unknown field in a CRD kind.
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "x"},
            "spec": {"selector": {}, "endpoints": [{"prot": "metrics"}]},
        },
        # A rule without expr.
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "x"},
            "spec": {"groups": [{"name": "g", "rules": [{"alert": "A"}]}]},
        },
    ],
)
def test_validation_catches_mistakes(broken: dict[str, Any]) -> None:
    with pytest.raises((AssertionError, kubernetes_validate.ValidationError)):
        validate(broken)
