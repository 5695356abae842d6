"""A table of each GPU's job type and utilisation, live on a terminal, as log lines otherwise."""

from __future__ import annotations

import logging
import math

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from profiler_app.core.durations import format_duration
from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, CycleResult, GpuProfile
from profiler_app.sinks import field_stat

log = logging.getLogger(__name__)

_JOB_STYLES = {"idle": "dim", "training": "green", "inference": "cyan", "bursty": "yellow"}
_MIB_PER_GIB = 1024


def _number(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}f}{unit}"


def _fb_used(profile: GpuProfile) -> str:
    mib = field_stat(profile, FB_USED, "max")
    if mib is None or not math.isfinite(mib):
        return "-"
    return f"{mib / _MIB_PER_GIB:.1f} GiB" if mib >= _MIB_PER_GIB else f"{mib:.0f} MiB"


def _pod(profile: GpuProfile) -> str:
    if profile.pod:
        return f"{profile.namespace}/{profile.pod}" if profile.namespace else profile.pod
    return "-"


def host_line(host: dict[str, float]) -> str:
    """``cpu 12% (max 40%)  mem 40%  disk 71%  disk io r 1.0 MB/s w ...  net rx ... tx ...``."""
    parts = []
    if "cpu_percent" in host:
        cpu = f"cpu {host['cpu_percent']:.0f}%"
        if "cpu_percent_max" in host:
            cpu += f" (max {host['cpu_percent_max']:.0f}%)"
        parts.append(cpu)
    for key, label in (("memory_percent", "mem"), ("disk_used_percent", "disk")):
        if key in host:
            parts.append(f"{label} {host[key]:.0f}%")
    for prefix, label, (first, second) in (
        ("disk", "disk io", ("read", "write")),
        ("network", "net", ("receive", "transmit")),
    ):
        a = host.get(f"{prefix}_{first}_bytes_per_second")
        b = host.get(f"{prefix}_{second}_bytes_per_second")
        if a is not None and b is not None:
            parts.append(f"{label} {first[0]} {_rate(a)} {second[0]} {_rate(b)}")
    return "  ".join(parts) if parts else "no host readings yet"


def _rate(bytes_per_second: float) -> str:
    value = bytes_per_second
    for unit in ("B/s", "kB/s", "MB/s"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB/s"


def _runs(profile: GpuProfile) -> str:
    """The engine and framework, ``vllm (pytorch)``, either alone, or ``-``."""
    if profile.engine and profile.framework:
        return f"{profile.engine} ({profile.framework})"
    return profile.engine or profile.framework or "-"


def render(result: CycleResult, notice: str | None = None) -> Group:
    """The table of one cycle, with the host line under it (and a notice, e.g. no driver)."""
    table = Table(
        title=f"{result.node}: last {format_duration(result.window_seconds)} "
        f"at {result.at:%Y-%m-%d %H:%M:%S} UTC",
        title_justify="left",
    )
    # The verdict columns never wrap or cut; reasons go under the table, one GPU a line, where a
    # narrow terminal folds them as prose instead of one word per line.
    table.add_column("GPU", no_wrap=True)
    table.add_column("job type", no_wrap=True, min_width=len("inference"))
    table.add_column("period", justify="right", no_wrap=True)
    table.add_column("util\nmax", justify="right", no_wrap=True)
    table.add_column("util\np95", justify="right", no_wrap=True)
    table.add_column("mem\ncopy", justify="right", no_wrap=True)
    table.add_column("FB\nused", justify="right", no_wrap=True)
    table.add_column("conf", justify="right", no_wrap=True)
    table.add_column("pod", overflow="fold", min_width=8)
    for profile in result.gpus:
        table.add_row(
            profile.device,
            Text(profile.job_type, style=_JOB_STYLES.get(profile.job_type, "")),
            _number(profile.period_seconds, "s", 1),
            _number(field_stat(profile, GPU_UTIL, "max"), "%"),
            _number(field_stat(profile, GPU_UTIL, "p95"), "%"),
            _number(field_stat(profile, MEM_COPY_UTIL, "max"), "%"),
            _fb_used(profile),
            _number(profile.confidence, digits=2),
            _pod(profile),
        )
    lines: list[Table | Text] = [table] if result.gpus else []
    lines.extend(
        Text(f"GPU {profile.device}: {'; '.join(profile.reasons)}", style="dim")
        for profile in result.gpus
        if profile.reasons
    )
    if not result.gpus:
        lines.append(Text(notice or "no GPUs found", style="yellow"))
    elif notice:
        lines.append(Text(notice, style="yellow"))
    if result.host:  # Prometheus mode reads no host
        lines.append(Text(f"host: {host_line(result.host)}"))
    return Group(*lines)


def summary_lines(result: CycleResult) -> list[str]:
    """One log line per GPU plus the host, for when stdout is not a terminal."""
    lines = [
        f"gpu {p.device} {p.job_type}"
        + (f" period {p.period_seconds:.1f}s" if p.period_seconds else "")
        + f" util max {_number(field_stat(p, GPU_UTIL, 'max'), '%')}"
        + f" p95 {_number(field_stat(p, GPU_UTIL, 'p95'), '%')}"
        + f" mem copy {_number(field_stat(p, MEM_COPY_UTIL, 'max'), '%')}"
        + f" fb {_fb_used(p)} pod {_pod(p)}"
        + (f" runs {_runs(p)}" if p.engine or p.framework else "")
        + f" confidence {_number(p.confidence, digits=2)}"
        + (f" ({'; '.join(p.reasons)})" if p.reasons else "")
        for p in result.gpus
    ]
    if result.host:
        lines.append(f"host {host_line(result.host)}")
    return lines


class TerminalSink:
    """Redraws the table each cycle when the console is a terminal; logs lines otherwise."""

    name = "terminal"

    def __init__(self, console: Console | None = None, notice: str | None = None) -> None:
        self.console = console or Console()
        self.notice = notice
        self._live: Live | None = None

    def publish(self, result: CycleResult) -> None:
        if not self.console.is_terminal:
            for line in summary_lines(result):
                log.info("%s", line)
            return
        view = render(result, self.notice)
        if self._live is None:
            self._live = Live(view, console=self.console, auto_refresh=False)
            self._live.start()
        else:
            self._live.update(view)
        self._live.refresh()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
