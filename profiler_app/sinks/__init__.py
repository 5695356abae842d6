"""Where results go: Kubernetes annotations, Prometheus metrics, the table store, the terminal."""

from typing import Protocol

from profiler_app.model import CycleResult


class Sink(Protocol):
    """Publishes each cycle's result. ``publish`` may raise; the daemon counts and logs it."""

    name: str

    def publish(self, result: CycleResult) -> None: ...

    def close(self) -> None: ...
