"""``TrialRun``: launches a plan's trials, measures them, and removes everything it created.

Before anything: the budget is checked by the caller (``plan.budget_refusal``). Then, in order:
the namespace's Lease is taken (lock.py: one run at a time); expired runs are collected; the
namespace, its ResourceQuota (waited for until enforced) and the PriorityClass are made sure of
(guards.py); the run's anchor ConfigMap is created. A create whose answer is lost is settled
before anything else starts, and an ended trial's GPUs stay taken until its pods are gone
(handover.py). Trials start cheapest first, at most
``parallel`` at a time and never more GPUs than the quota; a trial the step-time model predicts
with confidence is not started. Each trial is polled: pending past ``pending_timeout`` means
deleted and ``unschedulable``; a failed Job or PyTorchJob means ``failed`` with the reason; once
running, after the warm-up, it is measured each poll and ends early when its throughput is
stable, else at ``per_trial`` (which is also its server-side deadline). Whatever happens (a
fault, ``stop()`` from a signal handler, an exception) the ``finally`` deletes every trial and
the anchor, retrying while the API server is away, and reports what it could not delete.

Time comes from ``clock`` and passes through ``sleep``, which tests drive.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from profiler_app.trial import estimators, guards, handover
from profiler_app.trial import status as trial_status
from profiler_app.trial.cluster import ApiError, TrialCluster, UnavailableError
from profiler_app.trial.collect import ANCHOR_PREFIX, EXPIRES_AT, collect_runs, remaining_objects
from profiler_app.trial.estimators import Measurement
from profiler_app.trial.grace import DEFAULT_GRACE_SECONDS
from profiler_app.trial.guards import QUOTA_NAME
from profiler_app.trial.lock import NamespaceLock
from profiler_app.trial.manifests import (
    MANAGED_BY,
    PYTORCH_JOB,
    RUN_LABEL,
    STRONG,
    TRIAL_LABEL,
    TrialSettings,
    gpu_container,
    pod_specs,
    trial_manifest,
    trial_name,
)
from profiler_app.trial.metrics import MetricsUnavailableError, TrialMetrics
from profiler_app.trial.model import Point, confident_prediction
from profiler_app.trial.placement import PACKED
from profiler_app.trial.plan import Plan, PlannedTrial
from profiler_app.trial.results import (
    CANCELLED,
    FAILED,
    OK,
    PREDICTED,
    UNMEASURED,
    UNSCHEDULABLE,
    TrialResult,
)

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "gpu-profiler-trials"
PRIORITY_CLASS = "gpu-profiler-trial"

Json = dict[str, Any]


class Progress(Protocol):
    def update(self, board: list[dict[str, Any]]) -> None: ...
    def event(self, text: str) -> None: ...


class QuietProgress:
    def update(self, board: list[dict[str, Any]]) -> None:
        """Nothing to draw."""

    def event(self, text: str) -> None:
        log.info("%s", text)


@dataclass(frozen=True)
class Measuring:
    """How throughput can be measured, in the estimators' order of preference."""

    metric: str | None = None  # a Katib-style name=value on stdout
    metric_query: str | None = None  # PromQL, $POD substituted
    step_regex: re.Pattern[str] | None = None
    metrics: TrialMetrics | None = None  # Prometheus, for the query, period, proxy and peaks

    @property
    def reads_logs(self) -> bool:
        return self.metric is not None or self.step_regex is not None

    @property
    def ends_early(self) -> bool:
        """Only per-step samples (estimators 1 and 2) can show stability while running."""
        return self.reads_logs or self.metric_query is not None


@dataclass(frozen=True)
class RunOptions:
    budget_gpu_hours: float
    namespace: str = DEFAULT_NAMESPACE
    per_trial_seconds: float = 600.0
    warmup_seconds: float = 180.0
    pending_timeout_seconds: float = 120.0
    parallel: int = 1
    allow_scale_up: bool = False
    poll_seconds: float = 5.0
    ttl_seconds: int = 300
    priority_class: str = PRIORITY_CLASS
    skip_tolerance: float = 0.10
    cleanup_timeout_seconds: float = 180.0
    max_gpus: int | None = None  # the quota; default: the largest trial times parallel
    grace_seconds: int = DEFAULT_GRACE_SECONDS  # the cap on trial pods' grace period
    read_only_volumes: bool = False


@dataclass
class ActiveTrial:
    planned: PlannedTrial
    name: str
    kind: str
    created_at: float
    hostnames: tuple[str, ...] = ()
    bound_since: float | None = None  # on the runner's clock
    running_since: float | None = None  # cluster time the last pod's container started
    pods: list[str] = field(default_factory=list)
    lines: list[tuple[float, str]] = field(default_factory=list)
    last_stamp: float | None = None
    measurement: Measurement | None = None
    notes: list[str] = field(default_factory=list)
    state: str = "pending"


@dataclass
class RunOutcome:
    run_id: str
    results: list[TrialResult]
    leftovers: list[str]
    stopped: bool
    gpu_seconds: float


def new_run_id() -> str:
    return secrets.token_hex(4)


class TrialRun:
    def __init__(
        self,
        plan: Plan,
        options: RunOptions,
        cluster: TrialCluster,
        measuring: Measuring,
        *,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.plan = plan
        self.options = options
        self.cluster = cluster
        self.measuring = measuring
        self.progress = progress or QuietProgress()
        self.clock = clock
        self._stop = threading.Event()
        self._injected_sleep = sleep
        self.run_id = run_id or new_run_id()
        self.anchor: Json | None = None
        self.created: list[tuple[str, str]] = []  # (kind, name) of trial objects
        self.active: dict[int, ActiveTrial] = {}
        self.results: dict[int, TrialResult] = {}
        self.quota_gpus = options.max_gpus or max(
            (t.placement.gpus for t in plan.trials), default=1
        ) * max(1, options.parallel)
        self._outage_since: float | None = None
        self._uncertain: int | None = None  # a trial whose create got no answer
        self._attempted: dict[int, float] = {}  # when each trial's create was first sent
        self.draining: dict[int, handover.Draining] = {}
        self._lock = NamespaceLock(cluster, options.namespace, self.run_id, clock)

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the run to end (signal handlers call this): trials are cancelled and deleted."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> RunOutcome:
        leftovers: list[str] = []
        try:
            self._prepare()
            self._loop()
        finally:
            leftovers = self._cleanup()
            if not leftovers:  # else the Lease expires on its own, after the leftovers
                with contextlib.suppress(UnavailableError, ApiError):
                    self._lock.release()
        ordered = [self.results[t.index] for t in self.plan.trials if t.index in self.results]
        spent = sum(result.gpu_seconds for result in ordered)
        return RunOutcome(self.run_id, ordered, leftovers, self.stopping, spent)

    # -- setup -----------------------------------------------------------------------------

    def _prepare(self) -> None:
        ns = self.options.namespace
        try:
            self._lock.acquire()  # one run at a time in the namespace (lock.py)
        except ApiError as error:
            if error.status != 404:  # 404: no such namespace yet
                raise
            self.cluster.ensure_namespace(ns)
            self._lock.acquire()
        for run in collect_runs(self.cluster, ns, self.clock(), keep=self.run_id):
            self.progress.event(f"collected the objects of expired run {run}")
        quota = self.cluster.get("ResourceQuota", ns, QUOTA_NAME)
        if quota is None:
            self.cluster.ensure_namespace(ns)
            quota = self.cluster.create(
                "ResourceQuota", ns, guards.quota_manifest(self.quota_gpus, self.options.parallel)
            )
            self.progress.event(
                f"namespace {ns}: ResourceQuota {QUOTA_NAME} of {self.quota_gpus} GPUs"
            )
        else:
            self.quota_gpus = min(self.quota_gpus, guards.quota_gpus(quota, ns))
        if not (quota.get("status") or {}).get("hard"):
            waited = guards.wait_for_quota(
                self.cluster, ns, clock=self.clock, pause=self._pause, timeout=60.0
            )
            self.progress.event(f"the quota is enforced ({waited:.0f} s for its status)")
        if guards.ensure_priority_class(self.cluster, self.options.priority_class):
            self.progress.event(f"PriorityClass {self.options.priority_class} created")
        anchor = self.cluster.create("ConfigMap", ns, self._anchor_manifest())
        self.anchor = anchor
        self.progress.event(
            f"run {self.run_id}: anchor ConfigMap {ns}/{anchor['metadata']['name']}"
        )

    def _anchor_manifest(self) -> Json:
        longest = self.options.per_trial_seconds * max(1, len(self.plan.trials))
        expires = self.clock() + longest + self.options.cleanup_timeout_seconds
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{ANCHOR_PREFIX}{self.run_id}",
                "labels": {RUN_LABEL: self.run_id, MANAGED_BY[0]: MANAGED_BY[1]},
                "annotations": {EXPIRES_AT: f"{expires:.0f}"},
            },
            "data": {"source": self.plan.source, "trials": str(len(self.plan.trials))},
        }

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        queue = list(self.plan.trials)
        while (queue or self.active) and not self.stopping:
            with contextlib.suppress(UnavailableError):
                self._lock.renew()
            self._drain()
            queue = self._launch(queue)
            for index in list(self.active):
                self._guarded(self._poll, self.active[index])
            self.progress.update(self.board(queue))
            if self.active or self.draining or self._uncertain is not None:
                self._pause(self.options.poll_seconds)
        for trial in queue:
            self._finish_unstarted(trial, CANCELLED, "not started: the run was stopped")
        for index in list(self.active):
            active = self.active[index]
            self._guarded(self._measure, active)
            self._end(active, CANCELLED, "stopped before the end of the trial")

    def _guarded(self, action: Callable[[ActiveTrial], None], active: ActiveTrial) -> None:
        try:
            action(active)
            if self._outage_since is not None:
                self.progress.event("the API server answers again")
                self._outage_since = None
        except ApiError as error:
            if error.status != 403:
                raise
            raise ApiError(403, f"checking on trial {active.name}: {error.message}") from None
        except UnavailableError as error:
            if self._outage_since is None:
                self._outage_since = self.clock()
                self.progress.event(
                    f"the API server is unavailable ({error}); trials keep "
                    "their server-side deadlines"
                )

    def _launch(self, queue: list[PlannedTrial]) -> list[PlannedTrial]:
        waiting: list[PlannedTrial] = []
        # A trial whose create may have gone through is settled before any other starts.
        queue = sorted(queue, key=lambda t: t.index != self._uncertain)
        for position, trial in enumerate(queue):
            busy = sum(a.planned.placement.gpus for a in self.active.values())
            busy += sum(d.gpus for d in self.draining.values())
            gpus = trial.placement.gpus
            if gpus > self.quota_gpus:
                self._finish_unstarted(
                    trial,
                    UNSCHEDULABLE,
                    f"needs {gpus} GPUs, over the namespace's quota of {self.quota_gpus}",
                )
                continue
            hostnames = self._reserve(trial)
            if (
                len(self.active) + len(self.draining) >= self.options.parallel
                or busy + gpus > self.quota_gpus
                or hostnames is None
            ):
                waiting.append(trial)
                continue
            uncertain = trial.index == self._uncertain
            prediction = None if uncertain else self._prediction(trial)
            if prediction is not None:
                self.results[trial.index] = TrialResult(
                    trial.index,
                    trial_name(self.run_id, trial.index),
                    trial.placement,
                    trial.nodes_used,
                    PREDICTED,
                    measurement=prediction,
                    note=f"skipped: {prediction.note}",
                )
                self.progress.event(f"{trial.placement.describe()}: skipped, {prediction.note}")
                continue
            try:
                self._create(trial, hostnames, uncertain=uncertain)
                self._uncertain = None
            except UnavailableError:
                # The create may have gone through: nothing else starts until it is known.
                self._uncertain = trial.index
                return [*waiting, *queue[position:]]
            except ApiError as error:
                self._uncertain = None
                self._finish_unstarted(trial, FAILED, f"refused by the API server: {error}")
        return waiting

    def _prediction(self, trial: PlannedTrial) -> Measurement | None:
        """The model's confident prediction for ``trial``, as a measurement in the units of the
        estimator the trials so far were compared by; None when it is not confident."""
        estimator = self._compared_estimator()
        strong = self.plan.scaling.scale == STRONG
        points = [
            Point(r.placement.gpus, r.nodes_used, step, r.measurement.relative_error or 0.0)
            for r in self.results.values()
            if r.status == OK
            and r.measurement is not None
            and r.measurement.estimator == estimator
            and r.placement.model == trial.placement.model
            and (step := _step_time(r.measurement, r.placement.gpus, strong)) is not None
        ]
        predicted = confident_prediction(
            points,
            trial.placement.gpus,
            trial.nodes_used,
            strong=strong,
            tolerance=self.options.skip_tolerance,
        )
        if predicted is None:
            return None
        step = predicted.step_seconds
        error = predicted.relative_halfwidth / 1.96
        if estimator == estimators.METRIC:  # back into the job's own rate
            work = 1.0 if strong else float(trial.placement.gpus)
            unit = next(
                r.measurement.unit
                for r in self.results.values()
                if r.measurement is not None and r.measurement.estimator == estimator
            )
            return Measurement(
                estimator, work / step, unit, relative_error=error, note=predicted.describe()
            )
        return Measurement(
            estimator,
            1.0 / step,
            "steps/s",
            step_seconds=step,
            relative_error=error,
            note=predicted.describe(),
        )

    def _compared_estimator(self) -> str:
        """The most preferred estimator the model may use that measured a trial."""
        used = [
            r.measurement.estimator
            for r in self.results.values()
            if r.status == OK
            and r.measurement is not None
            and r.measurement.estimator != estimators.SM_PROXY
        ]
        return min(used, key=estimators.ESTIMATORS.index) if used else estimators.STEP_REGEX

    def _reserve(self, trial: PlannedTrial) -> tuple[str, ...] | None:
        """Nodes of the trial's own while it runs, so that parallel trials neither wait for nor
        disturb each other: the free nodes that can hold it (packed; once its pods are bound,
        only the node they are on), or all of its nodes (spread); None while taken."""
        taken = {name for active in self.active.values() for name in active.hostnames}
        taken |= {name for draining in self.draining.values() for name in draining.hostnames}
        if trial.placement.layout == PACKED:
            free = tuple(name for name in trial.hostnames if name not in taken)
            return free or None
        return None if taken & set(trial.hostnames) else trial.hostnames

    def _create(
        self, trial: PlannedTrial, hostnames: tuple[str, ...], *, uncertain: bool = False
    ) -> None:
        assert self.anchor is not None
        settings = TrialSettings(
            namespace=self.options.namespace,
            run_id=self.run_id,
            priority_class=self.options.priority_class,
            deadline_seconds=int(self.options.per_trial_seconds),
            ttl_seconds=self.options.ttl_seconds,
            anchor_name=self.anchor["metadata"]["name"],
            anchor_uid=self.anchor["metadata"]["uid"],
            allow_scale_up=self.options.allow_scale_up,
            grace_seconds=self.options.grace_seconds,
            read_only_volumes=self.options.read_only_volumes,
        )
        manifest = trial_manifest(
            self.plan.template,
            trial.placement,
            settings,
            index=trial.index,
            hostnames=hostnames,
            scaling=self.plan.scaling,
        )
        kind = manifest["kind"]
        name = manifest["metadata"]["name"]
        self.created.append((kind, name))
        started = self._attempted.setdefault(trial.index, self.clock())
        try:
            self.cluster.create(kind, self.options.namespace, manifest)
            said = f"started as {kind} {name}"
        except ApiError as error:
            if not (uncertain and error.status == 409):
                raise
            handover.adopt(self.cluster, kind, self.options.namespace, name, self.run_id)
            said = f"the create of {kind} {name} timed out but went through: adopted"
        self.active[trial.index] = ActiveTrial(trial, name, kind, started, hostnames)
        self.progress.event(f"{trial.placement.describe()}: {said}")

    # -- one trial -------------------------------------------------------------------------

    def _poll(self, active: ActiveTrial) -> None:
        ns, now = self.options.namespace, self.clock()
        obj = self.cluster.get(active.kind, ns, active.name)
        pods = self.cluster.list_of("Pod", ns, {TRIAL_LABEL: active.name})
        active.pods = sorted(p["metadata"]["name"] for p in pods)
        bound = {str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}
        if bound and active.bound_since is None:
            active.bound_since = now  # GPUs are held from the first pod's binding
        if bound and len(pods) >= self._expected_pods(active):
            active.hostnames = tuple(sorted(bound))  # the other nodes are free for other trials
        if obj is None:
            self._end(active, FAILED, "the trial object was deleted by someone else")
            return
        finished = trial_status.finished(obj)
        if finished is not None and finished[0] != "deadline":
            self._ended_early(active, *finished)
            return
        problem = trial_status.stuck(pods)
        if problem is not None:
            self._end(active, FAILED, problem, measured=False)
            return
        started = trial_status.all_started(pods, self._expected_pods(active))
        if started is None:
            if active.running_since is None and now - active.created_at >= (
                self.options.pending_timeout_seconds
            ):
                self._end(
                    active,
                    UNSCHEDULABLE,
                    f"pending for over {self.options.pending_timeout_seconds:.0f} s: "
                    f"{self._why_pending(active, pods)}",
                    measured=False,
                )
            return
        if active.running_since is None:
            active.running_since = started
            active.state = "warming up"
        if finished is not None or now - active.created_at >= (
            self.options.per_trial_seconds - self.options.poll_seconds
        ):
            self._measure(active)
            self._end(
                active,
                OK if active.measurement and active.measurement.ok else UNMEASURED,
                "ran for --per-trial",
            )
            return
        if now >= active.running_since + self.options.warmup_seconds:
            active.state = "measuring"
            if self.measuring.ends_early:
                self._measure(active, final=False)
                if active.measurement and active.measurement.stable:
                    self._measure(active)
                    self._end(active, OK, "throughput stable (CV under 5 %): ended early")

    def _why_pending(self, active: ActiveTrial, pods: list[Json]) -> str:
        """The scheduler's message, or, when pods are missing, the quota's refusal that the
        trial's controller recorded as a FailedCreate Event."""
        if len(pods) < self._expected_pods(active):
            try:
                events = self.cluster.events_of(self.options.namespace, active.name)
            except (UnavailableError, ApiError):
                events = []
            refused = trial_status.refused_creates(events)
            if refused is not None:
                return f"the namespace's quota refused its pods (FailedCreate: {refused})"
        return trial_status.pending_reason(pods)

    def _ended_early(self, active: ActiveTrial, kind: str, message: str) -> None:
        """The job completed or failed on its own: what it measured until then counts."""
        self._measure(active)
        measured = active.measurement is not None and active.measurement.ok
        if kind == "failed" and not measured:
            self._end(active, FAILED, message or "failed", measured=False)
        else:
            self._end(
                active, OK if measured else UNMEASURED, f"the job {kind} before the trial's end"
            )

    def _expected_pods(self, active: ActiveTrial) -> int:
        return active.planned.placement.pods if active.kind == PYTORCH_JOB else 1

    def _measure(self, active: ActiveTrial, final: bool = True) -> None:
        """Measure with the estimators in order of preference (with ``final`` False, only the
        per-step ones, for the early-end test)."""
        if active.running_since is None or not active.pods:
            return
        start = active.running_since + self.options.warmup_seconds
        end = self.clock()
        if self.measuring.reads_logs:
            self._read_log(active)
        lines = estimators.after(active.lines, start)
        tried: list[Measurement] = []
        if self.measuring.metric is not None:
            _times, values = estimators.katib_samples(lines, self.measuring.metric)
            tried.append(estimators.from_rate_samples(values, self.measuring.metric))
        metrics = self.measuring.metrics
        if self.measuring.metric_query is not None and metrics is not None and end > start:
            try:
                values = metrics.user_rate(self.measuring.metric_query, active.pods, start, end)
                tried.append(estimators.from_rate_samples(values, "metric"))
            except MetricsUnavailableError as error:
                tried.append(estimators.unmeasured(estimators.METRIC, str(error)))
        if self.measuring.step_regex is not None:
            tried.append(
                estimators.from_step_marks(estimators.step_marks(lines, self.measuring.step_regex))
            )
        if final and metrics is not None and end > start:
            tried += self._gpu_estimators(metrics, active, start, end)
        best = next((m for m in tried if m.ok), None)
        active.notes = [f"{m.estimator}: {m.note}" for m in tried if not m.ok and m.note]
        active.measurement = best or (tried[0] if tried else None)

    def _gpu_estimators(
        self, metrics: TrialMetrics, active: ActiveTrial, start: float, end: float
    ) -> list[Measurement]:
        ns, pods = self.options.namespace, active.pods
        try:
            utilisation = metrics.utilisation(ns, pods, start, end)
            period = estimators.from_waveform(utilisation, metrics.step)
            sm = metrics.sm_active(ns, pods, start, end)
            proxy = estimators.from_sm_activity(sm, active.planned.placement.gpus)
        except MetricsUnavailableError as error:
            return [estimators.unmeasured(estimators.PERIOD, str(error))]
        return [period, proxy]

    def _read_log(self, active: ActiveTrial) -> None:
        pod = trial_status.rank_zero(active.pods)
        spec = next(spec for _, spec in pod_specs(dict(self.plan.template.manifest)))
        container = (gpu_container(spec, self.plan.template.name) or {}).get("name")
        since = None
        if active.last_stamp is not None:
            since = datetime.fromtimestamp(int(active.last_stamp), UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
        try:
            text = self.cluster.pod_log(self.options.namespace, pod, container, since)
        except ApiError:
            return  # not started yet, or gone
        fresh = [
            (t, line)
            for t, line in estimators.parse_log(text)
            if active.last_stamp is None or t > active.last_stamp
        ]
        active.lines.extend(fresh)
        if fresh:
            active.last_stamp = fresh[-1][0]

    def _end(self, active: ActiveTrial, status: str, note: str, measured: bool = True) -> None:
        """Delete the trial and record its result."""
        self.active.pop(active.planned.index, None)
        ended = self.clock()
        try:
            self.cluster.delete(active.kind, self.options.namespace, active.name)
            for pod in active.pods:  # the trial's own short grace, whatever deletes them next
                self.cluster.delete(
                    "Pod", self.options.namespace, pod, grace_seconds=self.options.grace_seconds
                )
        except (UnavailableError, ApiError) as error:
            log.warning("could not delete %s now (%s); cleanup retries", active.name, error)
        placement = active.planned.placement
        self.draining[active.planned.index] = handover.Draining(
            active.planned.index, active.name, placement.gpus, active.hostnames, ended
        )
        held = ended - active.bound_since if active.bound_since is not None else 0.0
        peak = sm = None
        metrics = self.measuring.metrics
        if metrics is not None and active.running_since is not None and active.pods:
            try:
                peak = metrics.fb_peak_mib(
                    self.options.namespace, active.pods, active.running_since, ended
                )
                values = metrics.sm_active(
                    self.options.namespace, active.pods, active.running_since, ended
                )
                sm = float(np.mean(values)) if values.size else None
            except MetricsUnavailableError:
                pass
        notes = [note, *(active.notes if status in (OK, UNMEASURED) else [])]
        if status == OK and active.measurement is not None and active.measurement.note:
            notes.append(active.measurement.note)
        self.results[active.planned.index] = TrialResult(
            active.planned.index,
            active.name,
            placement,
            active.planned.nodes_used,
            status,
            measurement=active.measurement if measured else None,
            note="; ".join(n for n in notes if n),
            gpu_seconds=max(0.0, held) * placement.gpus,
            peak_fb_mib=peak,
            sm_active=sm,
        )
        self.progress.event(f"{placement.describe()}: {status} ({note})")

    def _drain(self) -> None:
        """Forget the ended trials whose pods are gone; their GPU time counts until then."""
        for index, draining in list(self.draining.items()):
            try:
                left = handover.pods_left(self.cluster, self.options.namespace, draining.name)
            except (UnavailableError, ApiError):
                return
            if left:
                continue
            del self.draining[index]
            took = max(0.0, self.clock() - draining.ended_at)
            result = self.results[index]
            if result.gpu_seconds > 0:  # it held GPUs: they were held until now
                self.results[index] = replace(
                    result, gpu_seconds=result.gpu_seconds + took * draining.gpus
                )
            self.progress.event(f"{draining.name}: its pods were gone {took:.0f} s after it ended")

    def _finish_unstarted(self, trial: PlannedTrial, status: str, note: str) -> None:
        self.results[trial.index] = TrialResult(
            trial.index,
            trial_name(self.run_id, trial.index),
            trial.placement,
            trial.nodes_used,
            status,
            note=note,
        )

    def board(self, queue: list[PlannedTrial]) -> list[dict[str, Any]]:
        """One line per trial for the live table."""
        now = self.clock()
        rows = []
        for trial in self.plan.trials:
            row: dict[str, Any] = {
                "trial": trial.placement.describe(),
                "elapsed": None,
                "throughput": None,
                "note": "",
            }
            if trial.index in self.active:
                active = self.active[trial.index]
                row |= {"status": active.state, "elapsed": now - active.created_at}
                if active.measurement is not None and active.measurement.ok:
                    row["throughput"] = f"{active.measurement.rate:.3g} {active.measurement.unit}"
            elif trial.index in self.results:
                result = self.results[trial.index]
                row |= {"status": result.status, "note": result.note}
                measured = result.measurement
                if measured is not None and measured.ok:
                    row["throughput"] = f"{measured.rate:.3g} {measured.unit}"
            else:
                row["status"] = "queued" if trial in queue else "planned"
            rows.append(row)
        return rows

    # -- cleanup ---------------------------------------------------------------------------

    def _cleanup(self) -> list[str]:
        """Delete every trial and the anchor; wait until their pods are gone. What could not be
        deleted within ``cleanup_timeout`` is returned (its deadline still ends it)."""
        ns = self.options.namespace
        deadline = self.clock() + self.options.cleanup_timeout_seconds
        pending = list(dict.fromkeys(self.created))
        if self.anchor is not None:
            pending.append(("ConfigMap", self.anchor["metadata"]["name"]))
        said = False
        while self.clock() < deadline:
            try:
                for kind, name in list(pending):
                    self.cluster.delete(kind, ns, name)
                    pending.remove((kind, name))
                if not pending and self.anchor is None:
                    return []
                remaining = remaining_objects(self.cluster, ns, self.run_id)
                if not pending and not remaining:
                    self.progress.event(f"run {self.run_id}: every object it created is deleted")
                    return []
            except UnavailableError as error:
                if not said:
                    self.progress.event(f"cleanup waits for the API server ({error})")
                    said = True
            except ApiError as error:
                log.warning("cleanup: %s", error)
            self._pause(min(self.options.poll_seconds, 5.0), interruptible=False)
        left = [f"{kind} {ns}/{name}" for kind, name in pending]
        with contextlib.suppress(UnavailableError, ApiError):
            left += remaining_objects(self.cluster, ns, self.run_id)
        return sorted(set(left))

    def _pause(self, seconds: float, *, interruptible: bool = True) -> None:
        """Sleep; a stop request cuts the loop's sleep short, not cleanup's waits."""
        if self._injected_sleep is not None:
            self._injected_sleep(seconds)
        elif interruptible:
            self._stop.wait(seconds)
        else:
            time.sleep(seconds)


def _step_time(measurement: Measurement, gpus: int, strong: bool) -> float | None:
    """Seconds a step: measured, or from a reported rate of work (weak scaling: a step does
    one batch per GPU)."""
    if measurement.step_seconds is not None:
        return measurement.step_seconds
    if measurement.rate is None or measurement.rate <= 0:
        return None
    return (1.0 if strong else float(gpus)) / measurement.rate
