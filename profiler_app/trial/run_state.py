"""``RunState``: what a run knows of its trials while it runs (started, draining, ended) and of
the objects it created; scheduling, watching and cleanup share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profiler_app.trial import handover
from profiler_app.trial.estimators import Measurement
from profiler_app.trial.manifests import trial_name
from profiler_app.trial.plan import PlannedTrial
from profiler_app.trial.results import TrialResult

Json = dict[str, Any]


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
class RunState:
    run_id: str
    quota_gpus: int
    anchor: Json | None = None
    created: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) of trial objects
    active: dict[int, ActiveTrial] = field(default_factory=dict)
    draining: dict[int, handover.Draining] = field(default_factory=dict)
    results: dict[int, TrialResult] = field(default_factory=dict)

    def finish_unstarted(self, trial: PlannedTrial, status: str, note: str) -> None:
        self.results[trial.index] = TrialResult(
            trial.index,
            trial_name(self.run_id, trial.index),
            trial.placement,
            trial.nodes_used,
            status,
            note=note,
        )
