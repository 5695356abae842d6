"""A clock that moves only when a test says so: a TEST DOUBLE for time.monotonic / time.time,
so back-off, heartbeats and outages of many minutes run in milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def rfc3339_nano(seconds: float) -> str:
    """A kubelet log timestamp: RFC 3339 with nanoseconds."""
    whole = int(seconds // 1)
    stamp = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{round((seconds - whole) * 1e9):09d}Z"
