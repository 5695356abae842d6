"""The trial's golden manifests (tests/unit/data/trial) are valid objects: strictly, against
Kubernetes' schemas (kubernetes-validate) and the Kubeflow training operator's PyTorchJob CRD
schema (with its source, beside the golden files). Here, not in tests/unit, because it needs the
[render] extra, which the profiler's unit tests at the minimum versions do not install."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from infra.render.checks.schema import closed
from infra.versions import KUBERNETES_VERSION
from tests.unit.test_trial_manifests import CASES, DATA, rendered


def pytorch_job_validator() -> jsonschema.Draft7Validator:
    schema = json.loads((DATA / "pytorchjob-v1-schema.json").read_text())
    schema.pop("$comment")
    schema = closed(schema)  # unknown fields are errors, as with strict field validation
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_files_are_valid_kubernetes_objects(case: str) -> None:
    manifest = yaml.safe_load((DATA / f"{case}.yaml").read_text())
    if manifest["kind"] == "PyTorchJob":
        errors = [error.message for error in pytorch_job_validator().iter_errors(manifest)]
        assert errors == []
        for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
            pod_object = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "x"},
                "spec": replica["template"]["spec"],
            }
            kubernetes_validate.validate(pod_object, KUBERNETES_VERSION, strict=True)
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_validators_catch_a_wrong_field() -> None:
    """The checks above can fail: a misplaced field is an error for both."""
    broken = rendered("pytorchjob-2-packed")
    broken["spec"]["runPolicy"]["activeDeadline"] = 10
    assert list(pytorch_job_validator().iter_errors(broken))
    job_object = rendered("job-1-gpu")
    job_object["spec"]["backoffLimits"] = 0
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job_object, KUBERNETES_VERSION, strict=True)
