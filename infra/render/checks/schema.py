"""The ``schema`` check: every object of the graph valid for the cluster.

Built-in kinds: kubernetes-validate's OpenAPI schemas of the cluster's Kubernetes version, strict
(unknown fields are errors, as with the API server's strict field validation). Custom kinds: the
``openAPIV3Schema`` of the CRD in the same graph (the one the chart installs), with unknown fields
made errors likewise; a custom kind without a CRD in the graph is itself an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate

from infra.render.graph import K8sObject, ObjectGraph


def closed(schema: Any) -> Any:
    """Objects with declared properties reject others (strict field validation)."""
    if isinstance(schema, dict):
        result = {key: closed(value) for key, value in schema.items()}
        if (
            "properties" in result
            and "additionalProperties" not in result
            and not result.get("x-kubernetes-preserve-unknown-fields")
        ):
            result["additionalProperties"] = False
        return result
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    return schema


@cache
def _crd_validator(schema_json: str) -> jsonschema.Draft7Validator:
    schema = closed(json.loads(schema_json))
    # metadata is validated by the API server, not by the CRD's schema.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def crd_schemas(graph: ObjectGraph) -> dict[tuple[str, str], str]:
    """``(apiVersion, Kind) -> openAPIV3Schema`` (as JSON) of every CRD version in the graph."""
    schemas = {}
    for crd in graph.of_kind("CustomResourceDefinition"):
        spec = crd.manifest["spec"]
        for version in spec.get("versions", ()):
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if schema is not None:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = json.dumps(schema, sort_keys=True)
    return schemas


@cache
def _builtin_problem(manifest_json: str, kube_version: str) -> str | None:
    manifest = json.loads(manifest_json)
    try:
        kubernetes_validate.validate(manifest, kube_version.lstrip("v"), strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path) or "(top)"
        return f"{path}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError:
        return (
            f"no schema for {manifest.get('apiVersion')} {manifest.get('kind')} in Kubernetes "
            f"{kube_version}, and no CRD for it in the stack"
        )
    return None


def object_problem(
    obj: K8sObject, schemas: Mapping[tuple[str, str], str], kube_version: str
) -> str | None:
    """Why one object would be rejected, or None."""
    schema = schemas.get((obj.api_version, obj.kind))
    if schema is not None:
        errors = sorted(_crd_validator(schema).iter_errors(obj.manifest), key=str)
        if errors:
            first = errors[0]
            path = ".".join(str(p) for p in first.path) or "(top)"
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return f"{path}: {first.message}{more}"
        return None
    manifest_json = json.dumps(obj.manifest, sort_keys=True)
    return _builtin_problem(manifest_json, kube_version)


def invalid_objects(graph: ObjectGraph) -> list[str]:
    """Every object that the API server would refuse, with its first schema error."""
    schemas = crd_schemas(graph)
    findings = []
    for obj in graph.objects:
        problem = object_problem(obj, schemas, graph.platform.kube_version)
        if problem:
            findings.append(f"{obj}: {problem}")
    return findings
