"""Trial manifests: a Job, a PyTorchJob and a Pod rewritten for placements, against golden files
that are themselves validated, strictly, against Kubernetes' schemas and the Kubeflow training
operator's PyTorchJob CRD schema (tests/infra/test_trial_golden_files.py: the [render] extra).

Set UPDATE_GOLDEN=1 to rewrite the golden files after an intended change, then read the diff.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from profiler_app.core.errors import UserError
from profiler_app.trial.manifests import (
    GLOBAL,
    PER_GPU,
    RUN_LABEL,
    STRONG,
    TRIAL_ENV,
    TRIAL_LABEL,
    TRIAL_RUNNER_ACCOUNT,
    WEAK,
    BatchScaling,
    TrialSettings,
    batch_value,
    load_template,
    strip_server_fields,
    template_warnings,
    trial_manifest,
)
from profiler_app.trial.placement import Placement

DATA = Path(__file__).parent / "data" / "trial"
SETTINGS = TrialSettings(
    namespace="gpu-profiler-trials",
    run_id="0a1b2c3d",
    priority_class="gpu-profiler-trial",
    deadline_seconds=600,
    ttl_seconds=300,
    anchor_name="trial-run-0a1b2c3d",
    anchor_uid="6b0c3e1a-7a0f-4a43-9d52-5f2f8e4b9c10",
)
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def container(gpus: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": "pytorch",
        "image": "ghcr.io/example/train:1.0",
        "command": ["python", "train.py"],
        "env": [{"name": "BATCH_SIZE", "value": "64"}],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        **extra,
    }


def job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "bert", "namespace": "ml", "labels": {"team": "nlp"}},
        "spec": {
            "backoffLimit": 4,
            "template": {
                "metadata": {"labels": {"team": "nlp"}},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [container(), {"name": "sidecar", "image": "busybox"}],
                    "tolerations": [GPU_TOLERATION],
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {"team": "nlp"}},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        },
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "pool", "operator": "In", "values": ["gpu"]}
                                        ]
                                    }
                                ]
                            }
                        },
                    },
                },
            },
        },
    }


def pytorch_job() -> dict[str, Any]:
    replica = {
        "replicas": 1,
        "restartPolicy": "OnFailure",
        "template": {"spec": {"containers": [container()], "tolerations": [GPU_TOLERATION]}},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": {
            "nprocPerNode": "1",
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {"Master": copy.deepcopy(replica), "Worker": replica},
        },
    }


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "notebook-train",
            "namespace": "ml",
            "uid": "0b6a-live",
            "resourceVersion": "42",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "x", "uid": "u"}],
            "labels": {"app": "train", "controller-uid": "abc"},
        },
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [container(2)],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        },
        "status": {"phase": "Running"},
    }


CASES = {
    "job-1-gpu": (job, Placement(1, 1, "packed", "NVIDIA-A10G", "nvidia.com/gpu.product")),
    "job-4-gpus": (job, Placement(4, 4, "packed", "NVIDIA-A10G", "nvidia.com/gpu.product")),
    "pytorchjob-2-packed": (pytorch_job, Placement(2, 2, "packed")),
    "pytorchjob-4-spread": (
        pytorch_job,
        Placement(4, 1, "spread", "g5.12xlarge", "node.kubernetes.io/instance-type"),
    ),
    "pytorchjob-4-packed-pods": (pytorch_job, Placement(4, 1, "packed")),
    "pod-2-gpus": (pod, Placement(2, 2, "packed")),
}


def rendered(case: str) -> dict[str, Any]:
    make, placement = CASES[case]
    template = load_template(make(), case)
    return trial_manifest(
        template,
        placement,
        SETTINGS,
        index=3,
        hostnames=("gpu-node-2", "gpu-node-1"),
        scaling=BatchScaling(STRONG, "BATCH_SIZE", PER_GPU),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_trial_manifest_matches_its_golden_file(case: str) -> None:
    golden = DATA / f"{case}.yaml"
    manifest = rendered(case)
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(yaml.safe_dump(manifest, sort_keys=False))
    assert yaml.safe_load(golden.read_text()) == manifest


def pod_specs_of(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    if manifest["kind"] == "Job":
        return [manifest["spec"]["template"]["spec"]]
    return [r["template"]["spec"] for r in manifest["spec"]["pytorchReplicaSpecs"].values()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_trial_carries_the_safety_settings(case: str) -> None:
    manifest = rendered(case)
    metadata = manifest["metadata"]
    assert metadata["namespace"] == "gpu-profiler-trials"
    assert metadata["labels"][RUN_LABEL] == "0a1b2c3d"
    assert metadata["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "trial-run-0a1b2c3d",
            "uid": SETTINGS.anchor_uid,
        }
    ]
    if manifest["kind"] == "Job":
        spec = manifest["spec"]
        assert (spec["activeDeadlineSeconds"], spec["backoffLimit"]) == (600, 0)
        assert spec["ttlSecondsAfterFinished"] == 300
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
    else:
        policy = manifest["spec"]["runPolicy"]
        assert policy == {
            "cleanPodPolicy": "All",
            "backoffLimit": 0,
            "activeDeadlineSeconds": 600,
            "ttlSecondsAfterFinished": 300,
            "suspend": False,
        }
    for spec in pod_specs_of(manifest):
        assert spec["priorityClassName"] == "gpu-profiler-trial"
        for each in spec["containers"]:
            assert {"name": TRIAL_ENV, "value": "1"} in each["env"]
        # Only the nodes found now: a pending trial never asks for a new node.
        for term in spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]:
            assert {
                "key": "kubernetes.io/hostname",
                "operator": "In",
                "values": ["gpu-node-1", "gpu-node-2"],
            } in term["matchExpressions"]


def test_layouts_become_pod_affinity_or_topology_spread() -> None:
    packed = rendered("pytorchjob-4-packed-pods")
    spread = rendered("pytorchjob-4-spread")
    trial = {"matchLabels": {TRIAL_LABEL: "trial-0a1b2c3d-3"}}
    for spec in pod_specs_of(packed):
        (term,) = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term == {"labelSelector": trial, "topologyKey": "kubernetes.io/hostname"}
        assert "topologySpreadConstraints" not in spec
    for spec in pod_specs_of(spread):
        assert spec["topologySpreadConstraints"] == [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": trial,
            }
        ]
        assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "g5.12xlarge"}
    replicas = spread["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 3)
    assert spread["spec"]["nprocPerNode"] == "1"
    single = rendered("pytorchjob-2-packed")["spec"]
    assert set(single["pytorchReplicaSpecs"]) == {"Master"}
    assert single["nprocPerNode"] == "2"
    # The template's own anti-affinity would forbid packing: the trial's layout replaces it.
    job_spec = rendered("job-4-gpus")["spec"]["template"]["spec"]
    assert "podAntiAffinity" not in job_spec["affinity"]
    term = job_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "pool", "operator": "In", "values": ["gpu"]} in term["nodeSelectorTerms"][0][
        "matchExpressions"
    ]


def test_allow_scale_up_leaves_nodes_open() -> None:
    template = load_template(job(), "job")
    settings = TrialSettings(**{**SETTINGS.__dict__, "allow_scale_up": True})
    manifest = trial_manifest(
        template, Placement(1, 1, "packed"), settings, index=0, hostnames=("gpu-node-1",)
    )
    terms = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert all(e["key"] != "kubernetes.io/hostname" for t in terms for e in t["matchExpressions"])


def test_a_live_pod_is_stripped_and_becomes_a_job() -> None:
    template = load_template(pod(), "pod")
    assert "status" not in template.manifest
    for key in ("uid", "resourceVersion", "ownerReferences"):
        assert key not in template.manifest["metadata"]
    assert template.manifest["metadata"]["labels"] == {"app": "train"}
    assert "nodeName" not in template.manifest["spec"]
    manifest = rendered("pod-2-gpus")
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    gpu = manifest["spec"]["template"]["spec"]["containers"][0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_a_live_job_loses_what_its_controller_set() -> None:
    live = job()
    live["metadata"] |= {"uid": "u1", "generation": 3, "managedFields": [{}]}
    live["spec"]["selector"] = {"matchLabels": {"controller-uid": "u1"}}
    live["spec"]["template"]["metadata"]["labels"] |= {"controller-uid": "u1", "job-name": "bert"}
    live["status"] = {"active": 1}
    stripped = strip_server_fields(live)
    assert "selector" not in stripped["spec"]
    assert stripped["spec"]["template"]["metadata"]["labels"] == {"team": "nlp"}
    assert set(stripped["metadata"]) == {"name", "namespace", "labels"}


@pytest.mark.parametrize(
    ("scale", "scope", "gpus", "expected"),
    [
        (WEAK, PER_GPU, 4, 64),  # the variable holds what stays constant
        (STRONG, GLOBAL, 4, 64),
        (WEAK, GLOBAL, 4, 256),  # a template on 1 GPU: per-GPU 64, four of them
        (STRONG, PER_GPU, 4, 16),  # global 64 over four GPUs
    ],
)
def test_batch_variable_keeps_the_chosen_batch(
    scale: str, scope: str, gpus: int, expected: int
) -> None:
    template = load_template(job(), "job")
    assert batch_value(template, BatchScaling(scale, "BATCH_SIZE", scope), gpus) == expected


def test_a_batch_that_does_not_divide_is_refused() -> None:
    template = load_template(job(), "job")
    with pytest.raises(ValueError, match="does not split over 3 GPUs"):
        batch_value(template, BatchScaling(STRONG, "BATCH_SIZE", PER_GPU), 3)
    with pytest.raises(UserError, match="--batch-env EPOCHS"):
        batch_value(template, BatchScaling(WEAK, "EPOCHS", GLOBAL), 2)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {
                **job(),
                "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "b"}]}}},
            },
            "requests no nvidia.com/gpu",
        ),
        (
            {**job(), "apiVersion": "apps/v1", "kind": "Deployment"},
            "unknown kind apps/v1/Deployment",
        ),
        ({**job(), "apiVersion": "kubeflow.org/v1", "kind": "TFJob"}, "unknown kind"),
        ({**job(), "spec": {**job()["spec"], "parallelism": 4}}, "runs 4 pods in parallel"),
        ("just text", "is not a Kubernetes object"),
    ],
)
def test_bad_templates_are_refused_in_one_line(document: Any, message: str) -> None:
    with pytest.raises(UserError, match=message) as raised:
        load_template(document, "job.yaml")
    assert "\n" not in str(raised.value)


def test_warnings_name_writable_claims_and_what_the_namespace_needs() -> None:
    template = load_template(pod(), "pod")
    warnings = template_warnings(template, "gpu-profiler-trials")
    assert any(
        "PersistentVolumeClaim datasets writable" in w and "checkpoints" in w for w in warnings
    )
    assert any("--read-only-volumes" in w for w in warnings)
    assert any("PersistentVolumeClaim datasets there" in w for w in warnings)
    read_only = pod()
    read_only["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = True
    warnings = template_warnings(load_template(read_only, "pod"), "gpu-profiler-trials")
    assert not any("writable" in w for w in warnings)


@pytest.mark.parametrize("key", ["serviceAccountName", "serviceAccount"])
def test_a_manifest_running_as_the_trial_runner_is_refused(key: str) -> None:
    manifest = job()
    manifest["spec"]["template"]["spec"][key] = TRIAL_RUNNER_ACCOUNT
    with pytest.raises(UserError, match=rf"spec\.{key} is gpu-profiler-trial, the trial runner's"):
        load_template(manifest, "job.yaml")
    manifest["spec"]["template"]["spec"][key] = "trainer"  # the workload's own: fine
    assert load_template(manifest, "job.yaml").gpus_per_pod >= 1
