"""Watching the started trials: each poll ends one that is stuck, pending too long, failed,
finished, stable or at its time (deleted, its result recorded), and forgets an ended one once
its pods are gone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from profiler_app.trial import handover
from profiler_app.trial import status as trial_status
from profiler_app.trial.cluster import ApiError, TrialCluster, UnavailableError
from profiler_app.trial.manifests import PYTORCH_JOB, TRIAL_LABEL
from profiler_app.trial.measuring import TrialMeasurer
from profiler_app.trial.progress import Progress
from profiler_app.trial.results import FAILED, OK, UNMEASURED, UNSCHEDULABLE, TrialResult
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.run_state import ActiveTrial, Json, RunState

log = logging.getLogger(__name__)


class TrialWatcher:
    """Polls and ends the started trials of ``state``, measuring them with ``measurer``."""

    def __init__(
        self,
        state: RunState,
        options: RunOptions,
        cluster: TrialCluster,
        measurer: TrialMeasurer,
        *,
        progress: Progress,
        clock: Callable[[], float],
    ) -> None:
        self.state = state
        self.options = options
        self.cluster = cluster
        self.measurer = measurer
        self.progress = progress
        self.clock = clock

    def poll(self, active: ActiveTrial) -> None:
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
            self.end(active, FAILED, "the trial object was deleted by someone else")
            return
        finished = trial_status.finished(obj)
        if finished is not None and finished[0] != "deadline":
            self._ended_early(active, *finished)
            return
        problem = trial_status.stuck(pods)
        if problem is not None:
            self.end(active, FAILED, problem, measured=False)
            return
        started = trial_status.all_started(pods, self._expected_pods(active))
        if started is None:
            if active.running_since is None and now - active.created_at >= (
                self.options.pending_timeout_seconds
            ):
                self.end(
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
            self.measurer.measure(active)
            self.end(
                active,
                OK if active.measurement and active.measurement.ok else UNMEASURED,
                "ran for --per-trial",
            )
            return
        if now >= active.running_since + self.options.warmup_seconds:
            active.state = "measuring"
            if self.measurer.measuring.ends_early:
                self.measurer.measure(active, final=False)
                if active.measurement and active.measurement.stable:
                    self.measurer.measure(active)
                    self.end(active, OK, "throughput stable (CV under 5 %): ended early")

    def end(self, active: ActiveTrial, status: str, note: str, measured: bool = True) -> None:
        """Delete the trial and record its result."""
        self.state.active.pop(active.planned.index, None)
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
        self.state.draining[active.planned.index] = handover.Draining(
            active.planned.index, active.name, placement.gpus, active.hostnames, ended
        )
        held = ended - active.bound_since if active.bound_since is not None else 0.0
        peak, sm = self.measurer.peaks(active, ended)
        notes = [note, *(active.notes if status in (OK, UNMEASURED) else [])]
        if status == OK and active.measurement is not None and active.measurement.note:
            notes.append(active.measurement.note)
        self.state.results[active.planned.index] = TrialResult(
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

    def drain(self) -> None:
        """Forget the ended trials whose pods are gone; their GPU time counts until then."""
        for index, draining in list(self.state.draining.items()):
            try:
                left = handover.pods_left(self.cluster, self.options.namespace, draining.name)
            except (UnavailableError, ApiError):
                return
            if left:
                continue
            del self.state.draining[index]
            took = max(0.0, self.clock() - draining.ended_at)
            result = self.state.results[index]
            if result.gpu_seconds > 0:  # it held GPUs: they were held until now
                self.state.results[index] = replace(
                    result, gpu_seconds=result.gpu_seconds + took * draining.gpus
                )
            self.progress.event(f"{draining.name}: its pods were gone {took:.0f} s after it ended")

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
        self.measurer.measure(active)
        measured = active.measurement is not None and active.measurement.ok
        if kind == "failed" and not measured:
            self.end(active, FAILED, message or "failed", measured=False)
        else:
            self.end(
                active, OK if measured else UNMEASURED, f"the job {kind} before the trial's end"
            )

    def _expected_pods(self, active: ActiveTrial) -> int:
        return active.planned.placement.pods if active.kind == PYTORCH_JOB else 1
