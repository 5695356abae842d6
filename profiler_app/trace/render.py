"""The ``--output table`` view of a trace summary: a header, then per GPU its verdict, evidence,
advice and ``nsys stats``-style tables (top kernels, memory operations, longest idle gaps),
then the CUDA API summary."""

from __future__ import annotations

from dataclasses import replace
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from profiler_app.trace.iterations import Iteration
from profiler_app.trace.summary import GpuTrace, Stat, TraceSummary

_VERDICT_STYLES = {
    "input-bound": "yellow",
    "launch-bound": "magenta",
    "transfer-bound": "cyan",
    "sync-bound": "red",
    "compute-bound": "green",
    "communication-bound": "blue",
}
API_ROWS = 10


def duration(ns: float) -> str:
    """Nanoseconds as the most readable unit: 1.23 s, 45.6 ms, 7.8 us, 950 ns."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def size(count: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count:.0f} B"


def _iteration(iteration: Iteration | None) -> str:
    if iteration is None:
        return "not found"
    where = (
        f'NVTX range "{iteration.range_name}"' if iteration.source == "nvtx" else "kernel sequence"
    )
    count = f", {iteration.count:,} iterations" if iteration.count else ""
    return f"{duration(iteration.seconds * 1e9)} ({where}{count})"


def _header(summary: TraceSummary) -> list[str]:
    version = ", ".join(
        part
        for part in (
            f"Nsight Systems {summary.product_version}" if summary.product_version else "",
            f"export schema {summary.schema_version or 'unknown'}",
        )
        if part
    )
    started = (
        summary.started_at.isoformat(timespec="seconds").replace("+00:00", "Z")
        if summary.started_at
        else "unknown"
    )
    lines = [
        f"Report {summary.report} ({version})",
        f"Started {started}; GPU activity spans {duration(summary.span_ns)}; "
        f"iteration {_iteration(summary.iteration)}",
    ]
    if summary.profiler_period_seconds is not None:
        lines.append(
            f"Continuous profiler's period for this pod: "
            f"{duration(summary.profiler_period_seconds * 1e9)}"
        )
    return lines


def _stat_table(title: str, stats: list[Stat], *, memory: bool = False) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("Time %", "Total", "Count", "Avg", "Min", "Max", "StdDev"):
        table.add_column(column, justify="right", no_wrap=True)
    if memory:
        table.add_column("Bytes", justify="right", no_wrap=True)
        table.add_column("Pageable", justify="right", no_wrap=True)
    table.add_column("Name" if not memory else "Kind", overflow="fold", min_width=12, max_width=60)
    for s in stats:
        cells: list[str | Text] = [
            f"{s.time_percent:.1f}",
            duration(s.total_ns),
            f"{s.count:,}",
            duration(s.avg_ns),
            duration(s.min_ns),
            duration(s.max_ns),
            duration(s.stddev_ns),
        ]
        if memory:
            cells.append(size(s.bytes or 0))
            pageable = (
                f"{s.pageable_count:,} ({duration(s.pageable_ns)})" if s.pageable_count else "-"
            )
            cells.append(Text(pageable, style="bold red" if s.pageable_count else ""))
        cells.append(s.name)
        table.add_row(*cells)
    return table


def _gpu(console: Console, gpu: GpuTrace, top: int) -> None:
    title = f"GPU {gpu.device}" + (f" {gpu.name}" if gpu.name else "")
    style = _VERDICT_STYLES.get(gpu.verdict.name, "bold")
    console.print(
        Text.assemble((title, "bold"), "  verdict: ", (gpu.verdict.name, f"bold {style}"))
    )
    console.print(
        f"  busy {gpu.busy_fraction:.1%} of {duration(gpu.span_ns)}; "
        f"{gpu.gaps.count:,} idle gaps totalling {duration(gpu.gaps.total_ns)}, "
        f"longest {duration(gpu.gaps.longest_ns)}; iteration {_iteration(gpu.iteration)}"
    )
    for line in gpu.verdict.evidence:
        console.print(f"  - {line}")
    console.print(f"  try: {gpu.verdict.advice}")
    if gpu.families:
        whole = sum(share.total_ns for share in gpu.families)
        console.print(
            "  kernel families: "
            + ", ".join(f"{s.label} {s.percent_of(whole):.1f}%" for s in gpu.families)
        )
    if gpu.reading:
        console.print(f"  reading: {gpu.reading}")
    if gpu.kernels:
        _table(console, _stat_table(f"Top kernels, GPU {gpu.device}", gpu.kernels[:top]))
    if gpu.memory:
        memory = _stat_table(f"Memory operations, GPU {gpu.device}", gpu.memory, memory=True)
        _table(console, memory)
    if gpu.longest_gaps:
        gaps = Table(title=f"Longest idle gaps, GPU {gpu.device}", title_justify="left")
        gaps.add_column("Starts at", justify="right", no_wrap=True)
        gaps.add_column("Length", justify="right", no_wrap=True)
        for gap in gpu.longest_gaps:
            gaps.add_row(f"{gap.start_ns / 1e9:.6f} s", duration(gap.length_ns))
        _table(console, gaps)


def _table(console: Console, table: Table) -> None:
    """A table no narrower than its numbers need: a narrow terminal wraps its lines rather than
    cutting figures and headers to an ellipsis."""
    needed = console.measure(table, options=console.options.update(width=10_000)).maximum
    if needed <= console.width:
        console.print(table)
        return
    wider = Console(
        file=console.file,
        width=needed,
        highlight=False,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
    )
    wider.print(table)


def render(summary: TraceSummary, out: TextIO, *, top: int = 10) -> None:
    # soft_wrap: prose is never broken at a fixed width (a pipe gets whole lines, a terminal
    # wraps them itself); tables are as wide as the terminal, or as their figures need.
    console = Console(
        file=out, width=160 if not out.isatty() else None, highlight=False, soft_wrap=True
    )
    for line in _header(summary):
        console.print(line)
    for gpu in summary.gpus:
        console.print()
        _gpu(console, gpu, top)
    if summary.api:
        console.print()
        marked = [
            replace(s, name=f"{s.name} *") if s.synchronising else s for s in summary.api[:API_ROWS]
        ]
        _table(console, _stat_table("CUDA API (synchronising calls marked *)", marked))
