"""What the stand-in API server holds, shared by its request threads under one lock: the
stored nodes and pods, the watch history every stored change adds to, the paged lists in
progress, the requests recorded and the faults injected.

Every stored change gets a new ``resourceVersion``; pods keep a history of watch events
(ADDED, MODIFIED, DELETED, and BOOKMARKs on request) from which watches resume.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support.apiserver.objects import Json


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    body: bytes
    authorization: str | None
    received_at: float = field(default_factory=time.time)  # Unix seconds

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Fault:
    """A fault injected into the answers to one method and path."""

    method: str
    path: str
    status: int | None  # None: hang for hang_seconds, then answer normally
    remaining: int | None  # None: forever
    retry_after: int | None = None
    hang_seconds: float = 0.0
    action: Callable[[], None] | None = None  # run before answering normally (``before``)
    cause: str | None = None  # a 500's cause (``internal_error``)
    lose_answer: bool = False  # do the request, then close the connection unanswered


@dataclass
class State:
    token: str
    lock: threading.Condition = field(default_factory=threading.Condition)
    stopping: threading.Event = field(default_factory=threading.Event)
    resource_version: int = 1
    nodes: dict[str, Json] = field(default_factory=dict)
    pods: dict[tuple[str, str], Json] = field(default_factory=dict)
    events: list[tuple[int, str, Json]] = field(default_factory=list)
    oldest_watchable: int = 0  # watches from an older version get 410 Gone
    gone_generation: int = 0  # bumped to end every open watch with 410 Gone
    open_watches: int = 0
    faults: list[Fault] = field(default_factory=list)
    recorded: list[RecordedRequest] = field(default_factory=list)
    answered: list[tuple[RecordedRequest, int]] = field(default_factory=list)
    # Paged lists in progress: continue token -> (resourceVersion, the items still to send).
    list_snapshots: dict[str, tuple[str, list[Json]]] = field(default_factory=dict)

    def commit(self, kind: str, key: Any, obj: Json, event: str | None = "MODIFIED") -> None:
        """Store ``obj`` under a new resourceVersion (caller holds the lock)."""
        self.resource_version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.resource_version)
        if kind == "nodes":
            self.nodes[key] = obj
        else:
            if event == "DELETED":
                self.pods.pop(key, None)
            else:
                self.pods[key] = obj
            self.events.append((self.resource_version, event or "MODIFIED", copy.deepcopy(obj)))
        self.lock.notify_all()

    def take_fault(self, request: RecordedRequest) -> Fault | None:
        """The fault injected for this request, if any, counted as used (caller holds the lock)."""
        for fault in self.faults:
            if fault.method == request.method and fault.path == request.path:
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self.faults.remove(fault)
                return fault
        return None


def on_node(pod: Json, node: str | None) -> bool:
    return node is None or pod.get("spec", {}).get("nodeName") == node
