"""``TrialRun``: launches a plan's trials, measures them, and removes everything it created.

Before anything: the budget is checked by the caller (``plan.budget_refusal``). Then, in order:
the namespace's Lease is taken, expired runs are collected, the namespace's guards are made sure
of and the run's anchor is created (preparation.py). Each poll, trials start (scheduling.py:
cheapest first, at most ``parallel`` at a time, within the quota, a confidently predicted one
skipped) and the started ones are checked on, measured and ended (watching.py, measuring.py).
Whatever happens (a fault, ``stop()`` from a signal handler, an exception) the ``finally``
deletes every trial and the anchor, retrying while the API server is away, and reports what it
could not delete (cleanup.py).

Time comes from ``clock`` and passes through ``sleep``, which tests drive.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from profiler_app.trial.cleanup import clean_up
from profiler_app.trial.cluster import ApiError, TrialCluster, UnavailableError
from profiler_app.trial.lock import NamespaceLock
from profiler_app.trial.measuring import Measuring, TrialMeasurer
from profiler_app.trial.plan import Plan
from profiler_app.trial.preparation import prepare
from profiler_app.trial.progress import Progress, QuietProgress, board
from profiler_app.trial.results import CANCELLED, TrialResult
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.run_state import ActiveTrial, RunState
from profiler_app.trial.scheduling import TrialScheduler
from profiler_app.trial.watching import TrialWatcher


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
        self.progress = progress or QuietProgress()
        self.clock = clock
        self._stop = threading.Event()
        self._injected_sleep = sleep
        self.run_id = run_id or new_run_id()
        quota_gpus = options.max_gpus or max(
            (t.placement.gpus for t in plan.trials), default=1
        ) * max(1, options.parallel)
        self.state = RunState(self.run_id, quota_gpus)
        self.scheduler = TrialScheduler(
            plan, options, self.state, cluster, progress=self.progress, clock=clock
        )
        self.measurer = TrialMeasurer(
            measuring,
            cluster,
            options.namespace,
            plan.template,
            warmup_seconds=options.warmup_seconds,
            clock=clock,
        )
        self.watcher = TrialWatcher(
            self.state, options, cluster, self.measurer, progress=self.progress, clock=clock
        )
        self._outage_since: float | None = None
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
            leftovers = clean_up(
                self.state,
                self.options,
                self.cluster,
                self._lock,
                progress=self.progress,
                clock=self.clock,
                wait=lambda seconds: self._pause(seconds, interruptible=False),
            )
        results = self.state.results
        ordered = [results[t.index] for t in self.plan.trials if t.index in results]
        spent = sum(result.gpu_seconds for result in ordered)
        return RunOutcome(self.run_id, ordered, leftovers, self.stopping, spent)

    def _prepare(self) -> None:
        prepare(
            self.plan,
            self.options,
            self.state,
            self.cluster,
            self._lock,
            progress=self.progress,
            clock=self.clock,
            pause=self._pause,
        )

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        state = self.state
        queue = list(self.plan.trials)
        while (queue or state.active) and not self.stopping:
            with contextlib.suppress(UnavailableError):
                self._lock.renew()
            self.watcher.drain()
            queue = self.scheduler.launch(queue)
            for index in list(state.active):
                self._guarded(self.watcher.poll, state.active[index])
            self.progress.update(board(self.plan, state, queue, self.clock()))
            if state.active or state.draining or self.scheduler.uncertain is not None:
                self._pause(self.options.poll_seconds)
        for trial in queue:
            state.finish_unstarted(trial, CANCELLED, "not started: the run was stopped")
        for index in list(state.active):
            active = state.active[index]
            self._guarded(self.measurer.measure, active)
            self.watcher.end(active, CANCELLED, "stopped before the end of the trial")

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

    def _pause(self, seconds: float, *, interruptible: bool = True) -> None:
        """Sleep; a stop request cuts the loop's sleep short, not cleanup's waits."""
        if self._injected_sleep is not None:
            self._injected_sleep(seconds)
        elif interruptible:
            self._stop.wait(seconds)
        else:
            time.sleep(seconds)
