"""How long a trial's pods may take to stop, so that a trial's spend has a bound.

A pod deleted (by the runner, by its Job's deadline, by the garbage collector) keeps its GPUs
until its containers exit or its ``terminationGracePeriodSeconds`` ends, and a ``preStop`` hook
runs inside that period. Copied from a template, an hour of grace and a ``sleep 3000`` hook
would let a 5-minute trial hold its GPUs for an hour. So every trial pod gets a grace period of
at most ``--grace-period`` (default 30 s, the API server's own default), and its ``preStop``
hooks are dropped: the worst a trial can hold its GPUs is its deadline plus that grace period,
which is what the budget check counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Json = dict[str, Any]
DEFAULT_GRACE_SECONDS = 30  # the API server's default terminationGracePeriodSeconds


def _containers(spec: Json) -> Iterator[Json]:
    yield from spec.get("initContainers") or ()  # sidecars (restartPolicy Always) have hooks
    yield from spec.get("containers") or ()


def bound_stopping(spec: Json, grace_seconds: int) -> None:
    """Cap the pod spec's grace period at ``grace_seconds`` and drop its preStop hooks."""
    asked = spec.get("terminationGracePeriodSeconds")
    current = DEFAULT_GRACE_SECONDS if asked is None else int(asked)
    spec["terminationGracePeriodSeconds"] = min(current, grace_seconds)
    for container in _containers(spec):
        lifecycle = container.get("lifecycle")
        if isinstance(lifecycle, dict):
            lifecycle.pop("preStop", None)
            if not lifecycle:
                container.pop("lifecycle")


def stopping_notes(specs: list[Json], grace_seconds: int) -> list[str]:
    """What trials change in how the template's pods stop, for ``plan`` and ``run`` to say."""
    notes = []
    longest = max(
        (
            DEFAULT_GRACE_SECONDS
            if s.get("terminationGracePeriodSeconds") is None
            else int(s["terminationGracePeriodSeconds"])
            for s in specs
        ),
        default=DEFAULT_GRACE_SECONDS,
    )
    if longest > grace_seconds:
        notes.append(
            f"the template's terminationGracePeriodSeconds {longest} is capped at "
            f"{grace_seconds} s in trials (--grace-period)"
        )
    hooked = sorted(
        {
            str(c.get("name"))
            for s in specs
            for c in _containers(s)
            if isinstance(c.get("lifecycle"), dict) and "preStop" in c["lifecycle"]
        }
    )
    if hooked:
        notes.append(
            f"the preStop hooks of {', '.join(hooked)} are dropped in trials: a hook runs "
            "inside the grace period and would hold the GPUs past the trial's deadline"
        )
    return notes
