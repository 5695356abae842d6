"""``gpu-profiler trial`` against the stand-in GPU cluster of tests/support/gpu_cluster (a TEST
DOUBLE: API server, Job and PyTorchJob controllers, scheduler, kubelets, GFD labels, a training
workload whose step period follows its placement, and a REAL Prometheus scraping the stand-in
dcgm-exporter).

Most runs are on a fake clock shared by the runner and the cluster, so minutes of trials,
deadlines and an outage of the API server pass in seconds; the iteration-period estimator runs
in real time, as it reads the waveform through the real Prometheus. Every case ends with every
object the run created deleted, GPUs in the trial namespace never past the quota, and GPU time
never past the budget.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from profiler_app.cli import main
from profiler_app.core.kube import connect
from profiler_app.trial.cluster import TrialCluster
from profiler_app.trial.manifests import load_template
from profiler_app.trial.measuring import Measuring
from profiler_app.trial.metrics import TrialMetrics
from profiler_app.trial.placement import GpuNode as PlannedNode
from profiler_app.trial.placement import parse_dims
from profiler_app.trial.plan import Plan, build_plan
from profiler_app.trial.results import summarise
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.runner import RunOutcome, TrialRun
from tests.support.clock import FakeClock
from tests.support.gpu_cluster import (
    GpuNode,
    Karpenter,
    Scenario,
    StandInGpuCluster,
    TrainingModel,
    running_gpu_cluster,
)
from tests.unit.test_trial_manifests import job, pytorch_job

pytestmark = [pytest.mark.integration]
NAMESPACE = "gpu-profiler-trials"
REPO = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^step=")
TWO_NODES = (GpuNode("gpu-node-1", gpus=4), GpuNode("gpu-node-2", gpus=4))


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock(time.time())


def training(template: dict[str, Any]) -> dict[str, Any]:
    """The template's containers run a training script (the stand-in's training model)."""
    specs = (
        [r["template"]["spec"] for r in template["spec"]["pytorchReplicaSpecs"].values()]
        if template["kind"] == "PyTorchJob"
        else [template["spec"]["template"]["spec"]]
    )
    for spec in specs:
        spec["containers"] = [c for c in spec["containers"] if c["name"] != "sidecar"]
        spec["containers"][0]["command"] = ["python", "train.py"]
        spec.get("affinity", {}).pop("nodeAffinity", None)
    return template


def trial_cluster(cluster: StandInGpuCluster, tmp_path: Path) -> TrialCluster:
    connection = connect(
        str(cluster.write_kubeconfig(tmp_path / "kubeconfig")), request_timeout=(1.0, 5.0)
    )
    assert connection is not None
    return TrialCluster(connection)


def make_plan(
    client: TrialCluster, template: dict[str, Any], *dims: str, per_trial: float = 300.0
) -> Plan:
    nodes = [n for n in (PlannedNode.from_api(item) for item in client.nodes()) if n]
    return build_plan(
        load_template(template, "template"),
        parse_dims(list(dims)),
        nodes,
        per_trial_seconds=per_trial,
    )


def fake_sleep(
    clock: FakeClock, each: Callable[[float], None] | None = None
) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if each is not None:
            each(clock())
        time.sleep(0.002)  # the server's threads take their turn

    return sleep


def options(**overrides: Any) -> RunOptions:
    defaults: dict[str, Any] = {
        "budget_gpu_hours": 10.0,
        "per_trial_seconds": 300.0,
        "warmup_seconds": 20.0,
        "pending_timeout_seconds": 60.0,
        "poll_seconds": 2.0,
        "cleanup_timeout_seconds": 120.0,
    }
    return RunOptions(**{**defaults, **overrides})


def assert_everything_deleted(cluster: StandInGpuCluster, outcome: RunOutcome) -> None:
    assert outcome.leftovers == []
    with cluster.lock:
        left = [
            key
            for key in cluster.batch.state.objects
            if key[0] not in ("resourcequotas", "priorityclasses")
        ]
        pods = [key for key in cluster.state.pods if key[0] == NAMESPACE]
        made = [kind for kind, _ns, _name in cluster.batch.state.created]
    assert left == []
    assert pods == []
    # The namespace's guards stay for the next run; everything else the run made is gone.
    assert {"ConfigMap"} <= set(made)


def assert_within_quota_and_budget(
    cluster: StandInGpuCluster, outcome: RunOutcome, run: TrialRun, budget: float
) -> None:
    with cluster.lock:
        peak = cluster.batch.state.peak_gpus.get(NAMESPACE, 0)
    assert 0 < peak <= run.state.quota_gpus
    assert outcome.gpu_seconds / 3600 <= budget


def test_a_pytorch_job_grid_gives_the_expected_recommendation(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    """Weak scaling with cheap NVLink-like sync within a node and dear sync across nodes: 4 GPUs
    packed is the best, spreading loses; the model skips trials it can predict."""
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES), clock=fake_clock) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(pytorch_job()), "gpus=1,2,4,8")
        assert len(plan.trials) == 6
        run = TrialRun(
            plan,
            options(),
            client,
            Measuring(step_regex=STEP),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock),
        )
        outcome = run.run()
        summary = summarise(outcome.results, "weak")
        statuses = {r.placement.describe(): r.status for r in outcome.results}
        assert_everything_deleted(cluster, outcome)
        assert_within_quota_and_budget(cluster, outcome, run, 10.0)
    assert statuses["4 GPUs packed on NVIDIA-A10G"] == "ok"
    assert "predicted" in statuses.values()
    assert summary.recommendation.startswith("4 GPUs packed on NVIDIA-A10G: the best throughput")
    by_name = {r.placement.describe(): r for r in outcome.results}
    packed = by_name["2 GPUs packed on NVIDIA-A10G"]
    spread = by_name["2 GPUs spread (2 pods x 1) on NVIDIA-A10G"]
    model = TrainingModel()
    assert packed.measurement is not None
    assert spread.measurement is not None
    assert packed.measurement.step_seconds == pytest.approx(model.step_seconds(2, 1, ""), rel=0.02)
    assert spread.measurement.step_seconds == pytest.approx(model.step_seconds(2, 2, ""), rel=0.02)
    assert all(r.note for r in outcome.results)
    for result in outcome.results:
        if result.status == "ok":
            assert "throughput stable" in result.note  # ended early, CV under 5 %


def test_parallel_job_trials_on_their_own_nodes_measured_by_katib_lines(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    nodes = (
        GpuNode("gpu-node-1", gpus=2),
        GpuNode("gpu-node-2", gpus=2),
        GpuNode("gpu-node-3", gpus=2),
    )
    with running_gpu_cluster(Scenario(gpu_nodes=nodes), clock=fake_clock) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(job()), "gpus=1,2")
        concurrent: list[int] = []

        def watch(now: float) -> None:
            with cluster.lock:
                jobs = [k for k in cluster.batch.state.objects if k[0] == "jobs"]
            concurrent.append(len(jobs))

        run = TrialRun(
            plan,
            options(parallel=2),
            client,
            Measuring(metric="samples_per_sec"),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock, watch),
        )
        outcome = run.run()
        assert_everything_deleted(cluster, outcome)
        assert_within_quota_and_budget(cluster, outcome, run, 10.0)
    assert max(concurrent) == 2
    assert [r.status for r in outcome.results] == ["ok", "ok"]
    one, two = outcome.results
    assert one.measurement is not None
    assert one.measurement.estimator == "metric"
    assert one.measurement.rate == pytest.approx(32 / 0.2, rel=0.02)  # samples/s of the model
    assert two.measurement is not None
    assert two.measurement.rate == pytest.approx(
        64 / TrainingModel().step_seconds(2, 1, ""), rel=0.02
    )


def test_failing_hanging_and_pending_trials_end_and_leave_nothing(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    """2 GPUs crash after three steps, 3 runs but never prints a step, and 4 stays pending: a
    production pod holds a GPU of each node, so no node the plan found can hold it."""
    scenario = Scenario(
        gpu_nodes=(
            GpuNode("gpu-node-1", gpus=4, busy_gpus=1),
            GpuNode("gpu-node-2", gpus=4, busy_gpus=1),
        ),
        training=TrainingModel(failing=(2,), hanging=(3,)),
    )
    with running_gpu_cluster(scenario, clock=fake_clock) as cluster:
        client = trial_cluster(cluster, tmp_path)
        # Planned as if the nodes were free (the plan reads allocatable GPUs).
        nodes = [
            PlannedNode(
                f"gpu-node-{i}",
                4,
                {"kubernetes.io/hostname": f"gpu-node-{i}"},
                ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},),
            )
            for i in (1, 2)
        ]
        plan = build_plan(
            load_template(training(job()), "job"),
            parse_dims(["gpus=1,2,3,4", "model=any"]),
            nodes,
            per_trial_seconds=300.0,
        )
        run = TrialRun(
            plan,
            options(),
            client,
            Measuring(step_regex=STEP),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock),
        )
        outcome = run.run()
        assert_everything_deleted(cluster, outcome)
        assert_within_quota_and_budget(cluster, outcome, run, 10.0)
    results = {r.placement.gpus: r for r in outcome.results}
    assert results[1].status == "ok"
    assert results[2].status == "failed"
    assert "backoff limit" in results[2].note
    assert results[3].status == "unmeasured"
    assert "step-regex: 0 step line(s) after the warm-up" in results[3].note
    assert results[4].status == "unschedulable"
    assert "pending for over 60 s: 0/3 nodes are available" in results[4].note


def test_the_api_server_gone_for_a_minute_mid_run(tmp_path: Path, fake_clock: FakeClock) -> None:
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES), clock=fake_clock) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(job()), "gpus=1,2", "model=any")
        start = fake_clock()
        outages: list[float] = []

        def outage(now: float) -> None:
            if not outages and now >= start + 10:
                cluster.down_until = now + 60
                outages.append(now)

        events: list[str] = []

        class Progress:
            def update(self, board: list[dict[str, Any]]) -> None:
                pass

            def event(self, text: str) -> None:
                events.append(text)

        run = TrialRun(
            plan,
            options(),
            client,
            Measuring(step_regex=STEP),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock, outage),
            progress=Progress(),
        )
        outcome = run.run()
        assert_everything_deleted(cluster, outcome)
        assert_within_quota_and_budget(cluster, outcome, run, 10.0)
    assert outages
    assert any("the API server is unavailable" in e for e in events)
    assert any("the API server answers again" in e for e in events)
    assert [r.status for r in outcome.results] == ["ok", "ok"]


def test_cleanup_waits_out_an_outage_that_starts_at_the_end(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    """Stopped (as by SIGTERM) while the API server is away: cleanup retries until it is back."""
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES), clock=fake_clock) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(job()), "gpus=1,2", "model=any")
        holder: list[TrialRun] = []

        def stop_during_outage(now: float) -> None:
            if holder and holder[0].state.active and not holder[0].stopping:
                cluster.down_until = now + 60
                holder[0].stop()

        run = TrialRun(
            plan,
            options(),
            client,
            Measuring(step_regex=STEP),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock, stop_during_outage),
        )
        holder.append(run)
        outcome = run.run()
        assert_everything_deleted(cluster, outcome)
    assert outcome.stopped
    assert {r.status for r in outcome.results} == {"cancelled"}


def test_deadlines_end_trials_the_runner_cannot_reach(
    tmp_path: Path, fake_clock: FakeClock
) -> None:
    """The runner is gone (killed with SIGKILL): the trials' own activeDeadlineSeconds and
    ttlSecondsAfterFinished end and remove them, and the next run collects the anchor."""
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES), clock=fake_clock) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(pytorch_job()), "gpus=2", "layout=spread")
        abandoned = TrialRun(
            plan,
            options(per_trial_seconds=120.0),
            client,
            Measuring(step_regex=STEP),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock),
        )
        abandoned._prepare()
        abandoned.scheduler.launch(list(plan.trials))  # started, then nobody looks after it
        fake_clock.advance(1)
        cluster.reconcile()
        with cluster.lock:
            assert [k for k in cluster.state.pods if k[0] == NAMESPACE]
        fake_clock.advance(120)  # past the deadline
        cluster.reconcile()
        with cluster.lock:  # deleted (cleanPodPolicy All), Terminating until their containers exit
            terminating = [p for k, p in cluster.state.pods.items() if k[0] == NAMESPACE]
        assert terminating
        assert all(p["metadata"]["deletionGracePeriodSeconds"] == 30 for p in terminating)
        fake_clock.advance(3)  # the training containers exit 2 s after SIGTERM
        cluster.reconcile()
        with cluster.lock:
            assert not [k for k in cluster.state.pods if k[0] == NAMESPACE]
            (job_object,) = [
                o for k, o in cluster.batch.state.objects.items() if k[0] == "pytorchjobs"
            ]
            reasons = [c["reason"] for c in job_object["status"]["conditions"]]
        assert "DeadlineExceeded" in reasons
        fake_clock.advance(300)  # past the time to live
        cluster.reconcile()
        with cluster.lock:
            assert not [k for k in cluster.batch.state.objects if k[0] == "pytorchjobs"]
        fake_clock.advance(3600)  # the anchor expired: the next run collects it
        later = TrialRun(
            plan,
            options(),
            client,
            Measuring(step_regex=STEP),
            clock=fake_clock,
            sleep=fake_sleep(fake_clock),
        )
        outcome = later.run()
        assert_everything_deleted(cluster, outcome)


def test_sigterm_mid_run_deletes_every_trial(tmp_path: Path) -> None:
    """The command as users run it, in real time; SIGTERM once a trial runs."""
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES)) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(job()), "gpus=1,2", "model=any", per_trial=60)
        plan_path = tmp_path / "plan.json"
        plan_path.write_text(json.dumps(plan.to_json()))
        kubeconfig = tmp_path / "kubeconfig"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        command = [
            sys.executable,
            "-m",
            "profiler_app",
            "trial",
            "run",
            "--plan",
            str(plan_path),
            "--budget-gpu-hours",
            "1",
            "--per-trial",
            "60s",
            "--warmup",
            "5s",
            "--poll",
            "0.5s",
            "--step-regex",
            "^step=",
            "--store-url",
            "none",
        ]
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with cluster.lock:
                running = [
                    p
                    for k, p in cluster.state.pods.items()
                    if k[0] == NAMESPACE and p["status"]["phase"] == "Running"
                ]
            if running:
                break
            time.sleep(0.1)
        assert running, "no trial started"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        with cluster.lock:
            left = [
                k
                for k in cluster.batch.state.objects
                if k[0] not in ("resourcequotas", "priorityclasses")
            ]
            pods = [k for k in cluster.state.pods if k[0] == NAMESPACE]
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopping, deleting every trial" in err
    assert "every object it created is deleted" in err
    assert left == []
    assert pods == []
    assert "cancelled" in out


@pytest.mark.slow
def test_the_iteration_period_through_a_real_prometheus(tmp_path: Path) -> None:
    """Estimator 3 in real time: the stand-in exporter's waveform of each trial's step period,
    scraped every second by the real Prometheus, read back and autocorrelated."""
    model = TrainingModel(compute_seconds=5.0, node_sync_seconds=0.5)
    nodes = (GpuNode("gpu-node-1", gpus=2),)
    with running_gpu_cluster(Scenario(gpu_nodes=nodes, training=model)) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(job()), "gpus=1,2", "model=any", per_trial=27)
        metrics = TrialMetrics(cluster.prometheus_url, step_seconds=1.0)
        run = TrialRun(
            plan,
            options(
                per_trial_seconds=27.0,
                warmup_seconds=2.0,
                poll_seconds=1.0,
                cleanup_timeout_seconds=30.0,
            ),
            client,
            Measuring(metrics=metrics),
        )
        outcome = run.run()
        metrics.close()
        assert_everything_deleted(cluster, outcome)
    for result, expected in zip(outcome.results, (5.0, 5.25), strict=True):
        assert result.status == "ok", result.note
        assert result.measurement is not None
        assert result.measurement.estimator == "period"
        assert result.measurement.step_seconds == pytest.approx(expected, rel=0.1)
        assert result.peak_fb_mib == 17_000.0
        assert result.sm_active is not None
        assert 0.3 < result.sm_active < 0.7


@pytest.mark.parametrize("allow_scale_up", [False, True])
def test_a_pending_trial_makes_karpenter_launch_a_node_only_when_allowed(
    tmp_path: Path, allow_scale_up: bool
) -> None:
    """A production pod holds a GPU of the only node, so the 2-GPU trial cannot start there.
    Held to the nodes that exist, it never gets a NodeClaim and ends unschedulable; with
    --allow-scale-up the stand-in Karpenter launches a node and the trial runs on it."""
    scenario = Scenario(
        gpu_nodes=(GpuNode("gpu-node-1", gpus=2, busy_gpus=1),),
        karpenter=Karpenter(gpus_per_node=2, consolidate_after_seconds=60.0),
    )
    with running_gpu_cluster(scenario) as cluster:
        client = trial_cluster(cluster, tmp_path)
        plan = make_plan(client, training(job()), "gpus=2", "model=any", per_trial=60)
        assert [t.hostnames for t in plan.trials] == [("gpu-node-1",)]
        run = TrialRun(
            plan,
            options(
                per_trial_seconds=60.0,
                warmup_seconds=1.0,
                pending_timeout_seconds=4.0,
                poll_seconds=0.3,
                allow_scale_up=allow_scale_up,
            ),
            client,
            Measuring(step_regex=STEP),
        )
        outcome = run.run()
        assert cluster.karpenter is not None
        with cluster.lock:
            claims = list(cluster.karpenter.node_claims)
        assert_everything_deleted(cluster, outcome)
    (result,) = outcome.results
    if allow_scale_up:
        assert len(claims) == 1
        assert result.status == "ok", result.note
    else:
        assert claims == []
        assert result.status == "unschedulable"


def test_plan_reads_a_running_workload_and_strips_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trial plan --workload``: the PyTorchJob as the API server holds it (status, UID,
    versions), and the nodes with their GFD labels, read through the kubeconfig."""
    with running_gpu_cluster(Scenario(gpu_nodes=TWO_NODES)) as cluster:
        kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
        cluster.namespaces.add("ml")
        with cluster.lock:
            code, _ = cluster.batch.create("pytorchjobs", "ml", training(pytorch_job()))
        assert code == 201
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        out = tmp_path / "plan.json"
        args = ["trial", "plan", "--workload", "ml/pytorchjobs/resnet", "--output", str(out)]
        assert main(args) == 0
        assert main(["trial", "plan", "--workload", "ml/Job/missing"]) == 2
    plan = json.loads(out.read_text())
    metadata = plan["template"]["manifest"]["metadata"]
    assert metadata == {"name": "resnet", "namespace": "ml"}
    assert "status" not in plan["template"]["manifest"]
    assert {t["placement"]["model"] for t in plan["trials"]} == {"NVIDIA-A10G"}
    assert "cannot read ml/Job/missing" in capsys.readouterr().err
