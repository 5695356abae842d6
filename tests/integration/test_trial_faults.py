"""``gpu-profiler trial`` end to end through the CLI against the stand-in GPU cluster
(tests/support/gpu_cluster, a TEST DOUBLE whose pods stop gracefully and whose quotas are
enforced once their status is filled, as kube-apiserver 1.35 does), under the faults and
templates that let a trial outspend its budget or touch what is not its own: a create whose
answer is lost, a template with an hour of grace and a preStop hook, shared writable volumes, a
PriorityClass above production, a 403 while trials are checked on, and a second run in the
namespace.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from profiler_app.cli import main
from tests.integration.test_trial_standin import NAMESPACE, TWO_NODES, training
from tests.support.gpu_cluster import Scenario, StandInGpuCluster, running_gpu_cluster
from tests.unit.test_trial_manifests import job

pytestmark = [pytest.mark.integration]
JOBS = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
RUN = ["--per-trial", "8s", "--warmup", "1s", "--poll", "0.3s", "--step-regex", "^step="]


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[StandInGpuCluster]:
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES)) as running:
        monkeypatch.setenv("KUBECONFIG", str(running.write_kubeconfig(tmp_path / "kubeconfig")))
        yield running


def plan(tmp_path: Path, template: dict[str, Any], *dims: str) -> Path:
    source = tmp_path / "job.yaml"
    source.write_text(yaml.safe_dump(template))
    out = tmp_path / "plan.json"
    command = ["trial", "plan", "--from", str(source), "--output", str(out), "--per-trial", "8s"]
    assert main([*command, "--dims", "model=any", *dims]) == 0
    return out


def run(plan_path: Path, *extra: str, budget: str = "1") -> int:
    command = ["trial", "run", "--plan", str(plan_path), "--budget-gpu-hours", budget]
    return main([*command, *RUN, "--store-url", "none", *extra])


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("gpu-profiler: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_create_whose_answer_is_lost_is_adopted_and_nothing_runs_beside_it(
    cluster: StandInGpuCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Job of trial 0 is created but its answer never arrives: the runner starts nothing
    else, creates it again, gets 409 AlreadyExists and adopts it; its GPU time is counted and
    never more GPUs than --parallel 1 allows are held at once."""
    plan_path = plan(tmp_path, training(job()), "gpus=1,2")
    cluster.lose_answers("POST", JOBS, times=1)
    results = tmp_path / "results.json"
    assert run(plan_path, "--results", str(results)) == 0
    err = capsys.readouterr().err
    assert "timed out but went through: adopted" in err
    document = json.loads(results.read_text())
    statuses = [row["status"] for row in document["trials"]]
    assert statuses == ["ok", "ok"], err
    assert all(row["gpu_seconds"] > 0 for row in document["trials"])
    with cluster.lock:
        assert cluster.batch.state.peak_gpus[NAMESPACE] <= 2  # one trial at a time
        assert [k for k in cluster.state.pods if k[0] == NAMESPACE] == []
    assert 409 in cluster.answers("POST", JOBS)


def test_a_long_grace_period_and_a_pre_stop_hook_are_not_copied_and_count_in_the_budget(
    cluster: StandInGpuCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    template = training(job())
    spec = template["spec"]["template"]["spec"]
    spec["terminationGracePeriodSeconds"] = 3600
    spec["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "3000"]}}}
    plan_path = plan(tmp_path, template, "gpus=1,2")
    err = capsys.readouterr().err
    assert "terminationGracePeriodSeconds 3600 is capped at 30 s" in err
    assert f"preStop hooks of {spec['containers'][0]['name']} are dropped" in err
    # 3 GPUs for 8 s fit 0.01 GPU-hours; with the 30 s grace period they do not.
    assert run(plan_path, budget="0.01") == 2
    assert "--grace-period 30s" in error_line(capsys.readouterr().err)
    assert cluster.requests("POST") == []  # refused before anything was created
    assert main(["trial", "run", "--plan", str(plan_path), "--budget-gpu-hours", "1", "--dry-run",
                 *RUN]) == 0  # fmt: skip
    for manifest in yaml.safe_load_all(capsys.readouterr().out):
        pod_spec = manifest["spec"]["template"]["spec"]
        assert pod_spec["terminationGracePeriodSeconds"] == 30
        assert "lifecycle" not in pod_spec["containers"][0]
    assert run(plan_path, "--grace-period", "5s") == 0
    deletes = [r.json() for r in cluster.requests("DELETE") if "/pods/" in r.path]
    assert deletes
    assert all(d.get("gracePeriodSeconds") == 5 for d in deletes)
    # The second trial started once the first one's pods were gone, and says after how long.
    assert "trial-" in capsys.readouterr().err.split("its pods were gone")[0]


def test_shared_writable_volumes_are_warned_about_and_mounted_read_only_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    template = training(job())
    spec = template["spec"]["template"]["spec"]
    spec["volumes"] = [
        {"name": "ckpt", "hostPath": {"path": "/mnt/checkpoints"}},
        {"name": "shared", "nfs": {"server": "fs.example", "path": "/exports/ml"}},
        {"name": "inline", "csi": {"driver": "efs.csi.aws.com"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    spec["containers"][0]["volumeMounts"] = [
        {"name": name, "mountPath": f"/{name}"} for name in ("ckpt", "shared", "inline", "scratch")
    ]
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES)) as cluster:
        monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
        plan_path = plan(tmp_path, template, "gpus=1")
    err = capsys.readouterr().err
    shared = (
        "hostPath /mnt/checkpoints",
        "NFS fs.example:/exports/ml",
        "CSI volume of driver efs.csi.aws.com",
    )
    for shown in shared:
        assert f"{shown} writable" in err
    assert "scratch" not in err  # an emptyDir is the trial's own
    command = ["trial", "run", "--plan", str(plan_path), "--budget-gpu-hours", "1", "--dry-run"]
    assert main([*command, *RUN]) == 0
    assert "hostPath /mnt/checkpoints writable" in capsys.readouterr().err  # run warns too
    assert main([*command, *RUN, "--read-only-volumes"]) == 0
    captured = capsys.readouterr()
    assert "writable" not in captured.err
    (manifest,) = list(yaml.safe_load_all(captured.out))
    pod_spec = manifest["spec"]["template"]["spec"]
    mounts = {
        m["name"]: m.get("readOnly", False) for m in pod_spec["containers"][0]["volumeMounts"]
    }
    assert mounts == {"ckpt": True, "shared": True, "inline": True, "scratch": False}
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["shared"]["nfs"]["readOnly"] is True
    assert volumes["inline"]["csi"]["readOnly"] is True


@pytest.mark.parametrize(
    ("existing", "message"),
    [
        ({"value": 1_000_000_000, "globalDefault": True}, "trials would outrank production"),
        ({"value": -100}, "may preempt pods (preemptionPolicy PreemptLowerPriority)"),
        ({"value": -100, "preemptionPolicy": "Never", "globalDefault": True}, "default"),
        (None, "cannot read PriorityClass gpu-profiler-trial (HTTP 403"),
    ],
)
def test_a_priority_class_that_could_put_trials_above_production_is_refused(
    cluster: StandInGpuCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    existing: dict[str, Any] | None,
    message: str,
) -> None:
    plan_path = plan(tmp_path, training(job()), "gpus=1")
    if existing is None:
        path = "/apis/scheduling.k8s.io/v1/priorityclasses/gpu-profiler-trial"
        cluster.fail("GET", path, 403)
    else:
        manifest = {"metadata": {"name": "gpu-profiler-trial"}, **existing}
        with cluster.lock:
            assert cluster.batch.create("priorityclasses", "", manifest)[0] == 201
    capsys.readouterr()
    assert run(plan_path) == 2
    assert message in error_line(capsys.readouterr().err)
    assert cluster.requests("POST", JOBS) == []
    with cluster.lock:
        assert not [k for k in cluster.batch.state.objects if k[0] == "configmaps"]


def test_a_403_while_checking_on_trials_is_one_line_naming_the_permission(
    cluster: StandInGpuCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = plan(tmp_path, training(job()), "gpus=1")
    cluster.fail("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", 403, times=1)
    capsys.readouterr()
    assert run(plan_path) == 2
    line = error_line(capsys.readouterr().err)
    assert f"no permission to list pods in namespace {NAMESPACE}" in line
    with cluster.lock:  # cleanup still ran
        assert not [k for k in cluster.batch.state.objects if k[0] in ("jobs", "configmaps")]


@pytest.mark.parametrize("renewed_ago", [10.0, 3600.0])
def test_a_second_run_in_the_namespace_is_refused_while_the_first_holds_its_lease(
    cluster: StandInGpuCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    renewed_ago: float,
) -> None:
    """A run that renewed the namespace's Lease 10 s ago holds it: the second run stops before
    creating anything. One that stopped renewing an hour ago is taken over."""
    plan_path = plan(tmp_path, training(job()), "gpus=1")
    cluster.namespaces.add(NAMESPACE)
    renewed = datetime.fromtimestamp(time.time() - renewed_ago, UTC)
    lease = {
        "metadata": {"name": "gpu-profiler-trial-run"},
        "spec": {
            "holderIdentity": "0ther0ne",
            "leaseDurationSeconds": 300,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    with cluster.lock:
        assert cluster.batch.create("leases", NAMESPACE, lease)[0] == 201
    capsys.readouterr()
    if renewed_ago < 300:
        assert run(plan_path) == 2
        line = error_line(capsys.readouterr().err)
        assert f"namespace {NAMESPACE} is in use by trial run 0ther0ne" in line
        assert cluster.requests("POST", JOBS) == []
    else:
        assert run(plan_path) == 0
        with cluster.lock:  # taken over, then released at the end of the run
            assert (
                "leases",
                NAMESPACE,
                "gpu-profiler-trial-run",
            ) not in cluster.batch.state.objects


def test_trial_clean_expired_removes_what_is_past_its_end_and_says_what_it_keeps(
    cluster: StandInGpuCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """An anchor left by a run cut off from the API server for longer than its cleanup window:
    ``trial clean --expired`` removes it without waiting for the next run, and lists the live
    run it keeps."""
    cluster.namespaces.add(NAMESPACE)
    now = time.time()
    for run_id, expires in (("0ld0ne00", now - 60), ("n0wrun00", now + 1800)):
        anchor = {
            "metadata": {
                "name": f"trial-run-{run_id}",
                "labels": {
                    "ai.centaurus.io/trial-run": run_id,
                    "app.kubernetes.io/managed-by": "gpu-profiler-trial",
                },
                "annotations": {"ai.centaurus.io/trial-run-expires-at": f"{expires:.0f}"},
            }
        }
        with cluster.lock:
            assert cluster.batch.create("configmaps", NAMESPACE, anchor)[0] == 201
    assert main(["trial", "clean", "--expired"]) == 0
    err = capsys.readouterr().err
    assert "removed 1 run(s) past their end: 0ld0ne00" in err
    kept_line = r"kept run n0wrun00: started [\d.]+s ago; collected by the next run in "
    kept_line += r"(29m\d+s|30m)\n"
    assert re.search(kept_line, err), err
    with cluster.lock:
        kept = [key[2] for key in cluster.batch.state.objects if key[0] == "configmaps"]
    assert kept == ["trial-run-n0wrun00"]


def test_trial_clean_older_than_goes_by_each_anchor_s_creation(
    cluster: StandInGpuCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trial clean --older-than`` removes the runs created at least that long ago, whatever
    their cleanup window, and only those."""
    cluster.namespaces.add(NAMESPACE)
    expires = f"{time.time() + 3600:.0f}"  # neither is past its end
    for run_id in ("0ld0ne00", "n0wrun00"):
        anchor = {
            "metadata": {
                "name": f"trial-run-{run_id}",
                "labels": {
                    "ai.centaurus.io/trial-run": run_id,
                    "app.kubernetes.io/managed-by": "gpu-profiler-trial",
                },
                "annotations": {"ai.centaurus.io/trial-run-expires-at": expires},
            }
        }
        with cluster.lock:
            assert cluster.batch.create("configmaps", NAMESPACE, anchor)[0] == 201
    two_hours_ago = datetime.fromtimestamp(time.time() - 7200, UTC)
    with cluster.lock:  # the first run's anchor was created two hours ago
        stored = cluster.batch.state.objects[("configmaps", NAMESPACE, "trial-run-0ld0ne00")]
        stored["metadata"]["creationTimestamp"] = two_hours_ago.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert main(["trial", "clean", "--older-than", "1h"]) == 0
    assert "removed 1 run(s) older than 1h: 0ld0ne00" in capsys.readouterr().err
    with cluster.lock:
        kept = [key[2] for key in cluster.batch.state.objects if key[0] == "configmaps"]
    assert kept == ["trial-run-n0wrun00"]


def test_a_trial_the_quota_refuses_says_so_rather_than_unschedulable(
    cluster: StandInGpuCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The namespace's quota lets no pod in: the Job controller records FailedCreate Events,
    and the trial's note says the quota refused its pods, not that no node had room."""
    plan_path = plan(tmp_path, training(job()), "gpus=1")
    cluster.namespaces.add(NAMESPACE)
    quota = {
        "metadata": {"name": "gpu-profiler-trials"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "4", "pods": "0"}},
    }
    with cluster.lock:
        assert cluster.batch.create("resourcequotas", NAMESPACE, quota)[0] == 201
    results = tmp_path / "results.json"
    assert run(plan_path, "--pending-timeout", "3s", "--results", str(results)) == 0
    (row,) = json.loads(results.read_text())["trials"]
    assert row["status"] == "unschedulable"
    assert "the namespace's quota refused its pods (FailedCreate: Error creating:" in row["note"]
    assert "exceeded quota: gpu-profiler-trials, requested: pods=1" in row["note"]
