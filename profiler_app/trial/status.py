"""What a trial's objects say about it: whether its Job or PyTorchJob ended, a container that
will never start, when its pods all started, why they are pending. Pure reads of the API
server's JSON, shared by the runner and its helpers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

Json = dict[str, Any]
IMMEDIATE_FAILURES = (
    "CreateContainerConfigError",
    "InvalidImageName",
    "CreateContainerError",
    "ErrImageNeverPull",
)


def rfc3339(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def finished(obj: Json) -> tuple[str, str] | None:
    """("failed"|"completed"|"deadline", message) once a Job or PyTorchJob has ended."""
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("status") != "True":
            continue
        kind, reason = condition.get("type"), condition.get("reason") or ""
        message = condition.get("message") or reason
        if kind in ("Failed", "FailureTarget"):  # FailureTarget: Failed once pods terminate
            return ("deadline" if "Deadline" in reason else "failed"), message
        if kind in ("Complete", "Succeeded"):
            return "completed", message
    return None


def stuck(pods: list[Json]) -> str | None:
    """A container that will never start (a missing Secret, a bad image name)."""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in IMMEDIATE_FAILURES:
                return (
                    f"pod {pod['metadata']['name']}: {waiting['reason']}: "
                    f"{waiting.get('message', '')}"
                ).rstrip(": ")
    return None


def all_started(pods: list[Json], expected: int) -> float | None:
    """When the last of the expected pods' containers started (cluster time), once all run."""
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) < expected or not running:
        return None
    starts = []
    for pod in running:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            started = rfc3339(((status.get("state") or {}).get("running") or {}).get("startedAt"))
            if started is not None:
                starts.append(started)
    return max(starts) if starts else None


def pending_reason(pods: list[Json]) -> str:
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message") or condition.get("reason") or "unscheduled")
    return "no pod was created (quota?)" if not pods else "pods not running"


def rank_zero(pods: list[str]) -> str:
    for suffix in ("-master-0", "-worker-0"):
        for pod in pods:
            if pod.endswith(suffix):
                return pod
    return pods[0]


def refused_creates(events: list[Json]) -> str | None:
    """The latest FailedCreate of a trial's controller (a quota refusing its pods), if any: what
    tells "the quota refused" from "the scheduler found no room"."""
    failed = [e for e in events if e.get("reason") == "FailedCreate"]
    if not failed:
        return None
    latest = max(failed, key=lambda e: str(e.get("lastTimestamp") or ""))
    return str(latest.get("message") or "FailedCreate")
