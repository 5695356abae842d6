"""Starting a run's trials: in the plan's order (cheapest first), at most ``parallel`` at a
time, within the quota, each on nodes of its own; a trial the model predicts with confidence is
skipped, and a create whose answer was lost is settled before anything else starts."""

from __future__ import annotations

from collections.abc import Callable

from profiler_app.trial import handover
from profiler_app.trial.cluster import ApiError, TrialCluster, UnavailableError
from profiler_app.trial.estimators import Measurement
from profiler_app.trial.manifests import TrialSettings, trial_manifest, trial_name
from profiler_app.trial.placement import PACKED
from profiler_app.trial.plan import Plan, PlannedTrial
from profiler_app.trial.prediction import predicted_measurement
from profiler_app.trial.progress import Progress
from profiler_app.trial.results import FAILED, PREDICTED, UNSCHEDULABLE, TrialResult
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.run_state import ActiveTrial, RunState


class TrialScheduler:
    """Starts the trials of ``plan`` into ``state``."""

    def __init__(
        self,
        plan: Plan,
        options: RunOptions,
        state: RunState,
        cluster: TrialCluster,
        *,
        progress: Progress,
        clock: Callable[[], float],
    ) -> None:
        self.plan = plan
        self.options = options
        self.state = state
        self.cluster = cluster
        self.progress = progress
        self.clock = clock
        self.uncertain: int | None = None  # a trial whose create got no answer
        self._attempted: dict[int, float] = {}  # when each trial's create was first sent

    def launch(self, queue: list[PlannedTrial]) -> list[PlannedTrial]:
        """Start what fits of ``queue``; the trials left waiting."""
        state = self.state
        waiting: list[PlannedTrial] = []
        # A trial whose create may have gone through is settled before any other starts.
        queue = sorted(queue, key=lambda t: t.index != self.uncertain)
        for position, trial in enumerate(queue):
            busy = sum(a.planned.placement.gpus for a in state.active.values())
            busy += sum(d.gpus for d in state.draining.values())
            gpus = trial.placement.gpus
            if gpus > state.quota_gpus:
                state.finish_unstarted(
                    trial,
                    UNSCHEDULABLE,
                    f"needs {gpus} GPUs, over the namespace's quota of {state.quota_gpus}",
                )
                continue
            hostnames = self._reserve(trial)
            if (
                len(state.active) + len(state.draining) >= self.options.parallel
                or busy + gpus > state.quota_gpus
                or hostnames is None
            ):
                waiting.append(trial)
                continue
            uncertain = trial.index == self.uncertain
            prediction = None if uncertain else self._prediction(trial)
            if prediction is not None:
                state.results[trial.index] = TrialResult(
                    trial.index,
                    trial_name(state.run_id, trial.index),
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
                self.uncertain = None
            except UnavailableError:
                # The create may have gone through: nothing else starts until it is known.
                self.uncertain = trial.index
                return [*waiting, *queue[position:]]
            except ApiError as error:
                self.uncertain = None
                state.finish_unstarted(trial, FAILED, f"refused by the API server: {error}")
        return waiting

    def _prediction(self, trial: PlannedTrial) -> Measurement | None:
        results = self.state.results.values()
        return predicted_measurement(trial, results, self.plan.scaling, self.options.skip_tolerance)

    def _reserve(self, trial: PlannedTrial) -> tuple[str, ...] | None:
        """Nodes of the trial's own while it runs, so that parallel trials neither wait for nor
        disturb each other: the free nodes that can hold it (packed; once its pods are bound,
        only the node they are on), or all of its nodes (spread); None while taken."""
        taken = {name for active in self.state.active.values() for name in active.hostnames}
        taken |= {name for draining in self.state.draining.values() for name in draining.hostnames}
        if trial.placement.layout == PACKED:
            free = tuple(name for name in trial.hostnames if name not in taken)
            return free or None
        return None if taken & set(trial.hostnames) else trial.hostnames

    def _create(
        self, trial: PlannedTrial, hostnames: tuple[str, ...], *, uncertain: bool = False
    ) -> None:
        state = self.state
        assert state.anchor is not None
        settings = TrialSettings(
            namespace=self.options.namespace,
            run_id=state.run_id,
            priority_class=self.options.priority_class,
            deadline_seconds=int(self.options.per_trial_seconds),
            ttl_seconds=self.options.ttl_seconds,
            anchor_name=state.anchor["metadata"]["name"],
            anchor_uid=state.anchor["metadata"]["uid"],
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
        state.created.append((kind, name))
        started = self._attempted.setdefault(trial.index, self.clock())
        try:
            self.cluster.create(kind, self.options.namespace, manifest)
            said = f"started as {kind} {name}"
        except ApiError as error:
            if not (uncertain and error.status == 409):
                raise
            handover.adopt(self.cluster, kind, self.options.namespace, name, state.run_id)
            said = f"the create of {kind} {name} timed out but went through: adopted"
        state.active[trial.index] = ActiveTrial(trial, name, kind, started, hostnames)
        self.progress.event(f"{trial.placement.describe()}: {said}")
