"""Progress of a run: a live table on a terminal, one line per event elsewhere (logs, CI), the
log without either; ``board`` makes the table's rows."""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from profiler_app.core.durations import format_duration
from profiler_app.trial.plan import Plan, PlannedTrial
from profiler_app.trial.run_state import RunState

log = logging.getLogger(__name__)


class Progress(Protocol):
    def update(self, board: list[dict[str, Any]]) -> None: ...
    def event(self, text: str) -> None: ...


class QuietProgress:
    def update(self, board: list[dict[str, Any]]) -> None:
        """Nothing to draw."""

    def event(self, text: str) -> None:
        log.info("%s", text)


class LiveProgress:
    """A rich live table of every trial, redrawn each poll; events print above it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.console = Console(file=stream or sys.stderr)
        self._live = Live(Table(), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._live.__exit__(kind, error, trace)

    def update(self, board: list[dict[str, Any]]) -> None:
        table = Table(title="gpu-profiler trial run")
        for column in ("trial", "status", "elapsed", "throughput", "note"):
            table.add_column(column, overflow="fold")
        for row in board:
            elapsed = row.get("elapsed")
            table.add_row(
                row["trial"],
                row["status"],
                format_duration(elapsed) if elapsed else "",
                row.get("throughput") or "",
                (row.get("note") or "")[:80],
            )
        self._live.update(table)

    def event(self, text: str) -> None:
        self.console.print(text, highlight=False)


class LineProgress:
    """One line per event on a stream that is no terminal."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stream.flush()

    def update(self, board: list[dict[str, Any]]) -> None:
        """Events say it all."""

    def event(self, text: str) -> None:
        print(f"gpu-profiler trial: {text}", file=self.stream, flush=True)


def progress_for(stream: TextIO | None = None) -> LiveProgress | LineProgress:
    target = stream or sys.stderr
    return LiveProgress(target) if target.isatty() else LineProgress(target)


def board(
    plan: Plan, state: RunState, queue: list[PlannedTrial], now: float
) -> list[dict[str, Any]]:
    """One line per trial for the live table."""
    rows = []
    for trial in plan.trials:
        row: dict[str, Any] = {
            "trial": trial.placement.describe(),
            "elapsed": None,
            "throughput": None,
            "note": "",
        }
        if trial.index in state.active:
            active = state.active[trial.index]
            row |= {"status": active.state, "elapsed": now - active.created_at}
            if active.measurement is not None and active.measurement.ok:
                row["throughput"] = f"{active.measurement.rate:.3g} {active.measurement.unit}"
        elif trial.index in state.results:
            result = state.results[trial.index]
            row |= {"status": result.status, "note": result.note}
            measured = result.measurement
            if measured is not None and measured.ok:
                row["throughput"] = f"{measured.rate:.3g} {measured.unit}"
        else:
            row["status"] = "queued" if trial in queue else "planned"
        rows.append(row)
    return rows
