"""The job types, and what a verdict can rest on."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class JobType(StrEnum):
    IDLE = "idle"
    TRAINING = "training"
    INFERENCE = "inference"
    BURSTY = "bursty"


class Basis(IntEnum):
    """What a verdict rests on, strongest first: the first that applies to a row wins."""

    IDLE = 0  # utilisation below the idle threshold
    UTIL_LOOP = 1  # a loop in utilisation
    SIGNAL_LOOP = 2  # a loop in power (or SM activity) while utilisation is flat
    WAITING = 3  # high utilisation at near-idle power: ranks waiting in a collective
    SIBLING = 4  # another GPU of the same job shows a loop or waits
    PRIOR = 5  # the workload's owner (or its command) is a training kind
    BURSTY = 6  # idle stretches, no iteration loop
    CADENCE = 7  # a loop that is not an iteration: requests at a steady rhythm
    STEADY = 8  # sustained activity, no loop

    @property
    def label(self) -> str:
        """The basis as a short name for metrics and the store: "signal-loop", "waiting", ..."""
        return self.name.lower().replace("_", "-")

    @property
    def job_type(self) -> JobType:
        if self is Basis.IDLE:
            return JobType.IDLE
        if self <= Basis.PRIOR:
            return JobType.TRAINING
        return JobType.BURSTY if self is Basis.BURSTY else JobType.INFERENCE
