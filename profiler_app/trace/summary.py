"""One trace, summarised per GPU: ``summarise`` runs the queries and the rules, ``to_json`` and
``profiler_app.trace.render`` present the result.

Statistics follow ``nsys stats``: time shares are of the listed items' total (kernels of that
GPU, memory operations of that GPU, CUDA API calls of the report), standard deviations are of
a sample (n - 1; 0 for a single instance), API names lose their ``_vNNNN`` suffix.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from profiler_app.core.errors import UserError
from profiler_app.trace import (
    events,
    families,
    groups,
    iterations,
    queries,
    schema,
    timeline,
    verdict,
)
from profiler_app.trace.events import Events
from profiler_app.trace.export import Export
from profiler_app.trace.families import Classifier
from profiler_app.trace.grouping import IntArray, SumOverflowError
from profiler_app.trace.groups import DurationStats
from profiler_app.trace.iterations import Iteration

LONGEST_GAPS = 5
MAX_SPAN_NS = 1 << 48  # 78 hours: longer than any trace

# ``--output json`` of trace is a contract (docs/cli.md): keys may be added within a version;
# removing, renaming or retyping one raises it. (``schema_version`` is the export's, not this.)
TRACE_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Stat:
    """One row of an ``nsys stats``-style summary; times in nanoseconds."""

    name: str
    count: int
    total_ns: int
    avg_ns: float
    min_ns: int
    max_ns: int
    stddev_ns: float
    time_percent: float
    bytes: int | None = None
    pageable_count: int = 0
    pageable_ns: int = 0
    pageable_bytes: int = 0
    synchronising: bool = False


@dataclass(frozen=True)
class IdleGap:
    start_ns: int  # on the report's timeline (what the nsys timeline shows)
    length_ns: int


@dataclass
class GpuTrace:
    device: int
    name: str | None
    uuid: str | None
    first_ns: int
    last_ns: int
    busy_ns: int
    gaps: timeline.GapTotals
    longest_gaps: list[IdleGap]
    sync_gap_count: int
    sync_gap_ns: int
    kernels: list[Stat]
    memory: list[Stat]
    launches: int
    launch_ns: int
    sync_calls: int
    sync_ns: int
    iteration: Iteration | None
    verdict: verdict.Verdict
    families: list[families.Share] = field(default_factory=list)  # most time first
    reading: str | None = None  # what the families say the model is
    communication_ns: int = 0  # NCCL kernels, summed
    exposed_communication_ns: int = 0  # when only NCCL kernels ran

    @property
    def span_ns(self) -> int:
        return self.last_ns - self.first_ns

    @property
    def busy_fraction(self) -> float:
        return self.busy_ns / self.span_ns if self.span_ns > 0 else 0.0


@dataclass
class TraceSummary:
    report: str
    schema_version: str | None
    product_version: str | None
    started_at: datetime | None
    origin_ns: int
    end_ns: int
    iteration: Iteration | None
    gpus: list[GpuTrace]
    api: list[Stat]
    warnings: list[str] = field(default_factory=list)
    profiler_period_seconds: float | None = None  # the continuous profiler's, for this pod

    @property
    def span_ns(self) -> int:
        return max(self.end_ns - self.origin_ns, 0)


def combine(groups: Iterable[DurationStats]) -> DurationStats:
    items = list(groups)
    return DurationStats(
        count=sum(g.count for g in items),
        total_ns=sum(g.total_ns for g in items),
        min_ns=min(g.min_ns for g in items),
        max_ns=max(g.max_ns for g in items),
        sum_squares=sum(g.sum_squares for g in items),
        first_start=min(g.first_start for g in items),
        last_end=max(g.last_end for g in items),
    )


def stat(name: str, durations: DurationStats, whole_ns: int, **extra: object) -> Stat:
    n = durations.count
    mean = durations.total_ns / n if n else 0.0
    # sum of squares minus n * mean^2, in floating point; tiny negative rounding means 0
    variance = (durations.sum_squares - mean * durations.total_ns) / (n - 1) if n > 1 else 0.0
    return Stat(
        name=name,
        count=n,
        total_ns=durations.total_ns,
        avg_ns=mean,
        min_ns=durations.min_ns,
        max_ns=durations.max_ns,
        stddev_ns=math.sqrt(max(variance, 0.0)),
        time_percent=100.0 * durations.total_ns / whole_ns if whole_ns else 0.0,
        **extra,  # type: ignore[arg-type]
    )


def _ranked(stats: list[Stat]) -> list[Stat]:
    return sorted(stats, key=lambda s: (-s.total_ns, -s.count, s.name))


def summarise(
    export: Export,
    *,
    iteration_range: str | None = None,
    classifier: Classifier = families.DEFAULT,
) -> TraceSummary:
    loaded = events.load(export)
    base = TraceSummary(
        report=str(export.path),
        schema_version=export.schema_version,
        product_version=export.product_version,
        started_at=_started_at(export),
        origin_ns=0,
        end_ns=0,
        iteration=None,
        gpus=[],
        api=[],
        warnings=list(export.warnings),
    )
    activity = [a for a in (loaded.kernels, loaded.memory) if len(a)]
    if activity:
        base.origin_ns = min(int(a.start.min()) for a in activity)
        base.end_ns = max(int(a.end.max()) for a in activity)
        if base.span_ns >= MAX_SPAN_NS:
            raise UserError(f"{export.path} spans more than 78 hours, longer than this tool reads")
    try:
        kernel_groups = groups.kernel_groups(
            loaded.kernels,
            loaded.calls,
            verdict.SHORT_KERNEL_NS,
            same_process=export.has_column(schema.KERNEL, "globalPid"),
        )
        memory_groups = groups.memory_groups(loaded.memory)
        api_groups = groups.api_groups(loaded.calls)
    except SumOverflowError:
        raise UserError(
            f"{export.path} holds durations that add up past 2^62 ns (146 years): not a "
            "capture this tool reads"
        ) from None
    names = queries.strings(
        export, [g.name_id for g in kernel_groups] + [g.name_id for g in api_groups]
    )
    base.api = _api_stats(api_groups, names)
    if not activity:
        return base
    kernel_names = {g.name_id: _kernel_name(g.name_id, names) for g in kernel_groups}
    family_of = {name: classifier.family(name) for name in set(kernel_names.values())}
    collectives = sorted(
        i for i, name in kernel_names.items() if family_of[name] == families.COMMUNICATION
    )
    gaps = _timeline(loaded, base)
    without_collectives = _timeline(loaded, base, leave_out=collectives) if collectives else gaps
    sync_calls = _sync_calls(export, loaded, base.origin_ns)
    base.iteration = iterations.from_nvtx(export, base.span_ns, iteration_range)
    gpu_names = queries.gpu_names(export)
    devices = sorted({g.device for g in kernel_groups} | {g.device for g in memory_groups})
    for device in set(gpu_names.shared) & set(devices):
        base.warnings.append(
            f"CUDA device {device} is a different GPU in different processes (each set its own "
            "CUDA_VISIBLE_DEVICES): their activity is summarised together as one GPU; profile "
            "one process per report to tell them apart"
        )
    for device in devices:
        name, uuid = gpu_names.by_device.get(device, (None, None))
        base.gpus.append(
            _gpu(
                GpuInput(
                    device=device,
                    name=name,
                    uuid=uuid,
                    kernels=[g for g in kernel_groups if g.device == device],
                    memory=[g for g in memory_groups if g.device == device],
                    gaps=gaps.of(device),
                    exposed_communication_ns=gaps.busy_ns.get(device, 0)
                    - without_collectives.busy_ns.get(device, 0),
                ),
                names=names,
                family_of=family_of,
                classifier=classifier,
                api_groups=api_groups,
                sync_calls=sync_calls,
                summary=base,
            )
        )
    if base.iteration is None and base.gpus:
        busiest = max(base.gpus, key=lambda g: sum(k.total_ns for k in g.kernels))
        base.iteration = busiest.iteration
    return base


def _started_at(export: Export) -> datetime | None:
    started_ns = queries.session_start_utc_ns(export)
    return datetime.fromtimestamp(started_ns / 1e9, UTC) if started_ns is not None else None


def _timeline(
    loaded: Events, summary: TraceSummary, leave_out: list[int] | None = None
) -> timeline.Timeline:
    """Each GPU's busy time and gaps; ``leave_out``: without the kernels of these names."""
    kernels, memory = loaded.kernels, loaded.memory
    device, start, end = kernels.device, kernels.start, kernels.end
    if leave_out:
        kept = np.isin(kernels.name, np.array(leave_out, np.int64), invert=True)
        device, start, end = device[kept], start[kept], end[kept]
    return timeline.build(
        np.concatenate([device, memory.device]),
        np.concatenate([start, memory.start]),
        np.concatenate([end, memory.end]),
        summary.origin_ns,
        summary.span_ns,
    )


@dataclass(frozen=True)
class SyncCalls:
    """Timed calls to ``schema.SYNCHRONISING_CALLS``: process, start and end after the origin."""

    pid: IntArray
    start: IntArray
    end: IntArray


def _sync_calls(export: Export, loaded: Events, origin: int) -> SyncCalls:
    calls = loaded.calls
    if calls is None:
        empty = np.empty(0, np.int64)
        return SyncCalls(empty, empty, empty)
    ids = queries.string_ids(export, schema.SYNCHRONISING_CALLS)
    chosen = calls.timed & np.isin(calls.name, np.array(ids, np.int64))
    return SyncCalls(calls.pid[chosen], calls.start[chosen] - origin, calls.end[chosen] - origin)


@dataclass(frozen=True)
class GpuInput:
    """One GPU's groups and gaps."""

    device: int
    name: str | None
    uuid: str | None
    kernels: list[groups.KernelGroup]
    memory: list[groups.MemoryGroup]
    gaps: timeline.Gaps
    exposed_communication_ns: int  # busy with NCCL kernels only


def _gpu(
    gpu: GpuInput,
    *,
    names: dict[int, str],
    family_of: dict[str, str],  # kernel name -> family
    classifier: Classifier,
    api_groups: list[groups.ApiGroup],
    sync_calls: SyncCalls,
    summary: TraceSummary,
) -> GpuTrace:
    kernels, memory = gpu.kernels, gpu.memory
    window = combine([g.durations for g in kernels] + [g.durations for g in memory])
    span = window.last_end - window.first_start
    first = window.first_start - summary.origin_ns
    iteration = summary.iteration or iterations.from_activity(gpu.gaps, first, span)
    gaps = gpu.gaps.totals(verdict.LARGE_GAP_NS)
    longest = gpu.gaps.longest(LONGEST_GAPS)
    pids = sorted({g.pid for g in kernels} | {g.pid for g in memory}, key=lambda p: p or -1)
    sync_gap_count, sync_gap_ns = _gaps_during_sync(gpu.gaps, pids, sync_calls)
    api_names = {g.name_id: schema.api_name(names.get(g.name_id, "")) for g in api_groups}
    sync = [
        g.durations
        for g in api_groups
        if api_names[g.name_id] in schema.SYNCHRONISING_CALLS and _same_process(g.pid, pids)
    ]
    sync_calls_count = sum(d.count for d in sync)
    sync_ns = sum(d.total_ns for d in sync)
    graph_launch_ns = sum(
        g.durations.total_ns
        for g in api_groups
        if api_names[g.name_id] in schema.GRAPH_LAUNCH_CALLS and _same_process(g.pid, pids)
    )
    kernel_stats = _kernel_stats(kernels, names)
    shares = _family_shares(kernel_stats, family_of, classifier)
    collectives = [k for k in kernel_stats if family_of.get(k.name) == families.COMMUNICATION]
    memory_stats = _memory_stats(memory)
    figures = verdict.GpuFigures(
        span_ns=span,
        busy_ns=span - gaps.total_ns,
        kernel_count=sum(s.count for s in kernel_stats),
        kernel_ns=sum(s.total_ns for s in kernel_stats),
        short_kernels=sum(g.short_count for g in kernels),
        launch_ns=sum(g.launch_ns for g in kernels) + graph_launch_ns,
        memory_ns=sum(s.total_ns for s in memory_stats),
        memory_count=sum(s.count for s in memory_stats),
        pageable_ns=sum(s.pageable_ns for s in memory_stats),
        pageable_count=sum(s.pageable_count for s in memory_stats),
        large_gap_count=gaps.large_count,
        large_gap_ns=gaps.large_ns,
        sync_gap_ns=sync_gap_ns,
        sync_calls=sync_calls_count,
        sync_ns=sync_ns,
        idle_ns=gaps.total_ns,
        iteration_ns=round(iteration.seconds * 1e9) if iteration else None,
        communication_ns=sum(k.total_ns for k in collectives),
        communication_count=sum(k.count for k in collectives),
        exposed_communication_ns=gpu.exposed_communication_ns,
        top_collective=_short_name(collectives[0].name) if collectives else None,
    )
    return GpuTrace(
        device=gpu.device,
        name=gpu.name,
        uuid=gpu.uuid,
        first_ns=window.first_start,
        last_ns=window.last_end,
        busy_ns=figures.busy_ns,
        gaps=gaps,
        longest_gaps=[IdleGap(start + summary.origin_ns, length) for start, length in longest],
        sync_gap_count=sync_gap_count,
        sync_gap_ns=sync_gap_ns,
        kernels=kernel_stats,
        memory=memory_stats,
        launches=sum(g.launches for g in kernels),
        launch_ns=figures.launch_ns,
        sync_calls=sync_calls_count,
        sync_ns=sync_ns,
        iteration=iteration,
        verdict=verdict.judge(figures),
        families=shares,
        reading=families.reading(shares),
        communication_ns=figures.communication_ns,
        exposed_communication_ns=figures.exposed_communication_ns,
    )


def _gaps_during_sync(
    gaps: timeline.Gaps, pids: list[int | None], calls: SyncCalls
) -> tuple[int, int]:
    """The short gaps that began while a process of this GPU was blocked in a synchronising
    call (or up to ``verdict.SYNC_SLACK_NS`` after it returned); every process's calls when
    one of the GPU's is unknown."""
    known = [pid for pid in pids if pid is not None]
    chosen = np.ones(calls.pid.size, bool)
    if known and None not in pids:
        chosen = np.isin(calls.pid, np.array(known, np.int64))
    return gaps.during(
        calls.start[chosen], calls.end[chosen], verdict.SYNC_SLACK_NS, verdict.LARGE_GAP_NS
    )


def _same_process(pid: int | None, pids: list[int | None]) -> bool:
    """Does a call of process ``pid`` belong to a GPU used by ``pids`` (unknown: assume so)?"""
    return pid is None or None in pids or pid in pids


def _kernel_stats(kernels: list[groups.KernelGroup], names: dict[int, str]) -> list[Stat]:
    by_name: dict[str, list[DurationStats]] = defaultdict(list)
    for group in kernels:
        by_name[_kernel_name(group.name_id, names)].append(group.durations)
    whole = sum(g.durations.total_ns for g in kernels)
    return _ranked([stat(name, combine(items), whole) for name, items in by_name.items()])


def _kernel_name(name_id: int, names: dict[int, str]) -> str:
    return names.get(name_id, f"kernel #{name_id}")


def _family_shares(
    kernels: list[Stat], family_of: dict[str, str], classifier: Classifier
) -> list[families.Share]:
    """Kernel time, instances and names per family, most time first."""
    totals: dict[str, list[int]] = {}
    for kernel in kernels:
        entry = totals.setdefault(family_of.get(kernel.name, families.OTHER), [0, 0, 0])
        entry[0] += kernel.total_ns
        entry[1] += kernel.count
        entry[2] += 1
    shares = [
        families.Share(family, classifier.label(family), total, count, names)
        for family, (total, count, names) in totals.items()
    ]
    return sorted(shares, key=lambda share: (-share.total_ns, share.family))


def _short_name(kernel: str) -> str:
    """``ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<...>)`` -> ``ncclDevKernel_SendRecv``."""
    return re.split(r"[<(]", kernel.removeprefix("void "), maxsplit=1)[0].strip() or kernel


def _memory_stats(memory: list[groups.MemoryGroup]) -> list[Stat]:
    by_kind: dict[str, list[groups.MemoryGroup]] = defaultdict(list)
    for group in memory:
        by_kind[group.kind].append(group)
    whole = sum(g.durations.total_ns for g in memory)
    stats = []
    for kind, items in by_kind.items():
        pageable = [g for g in items if g.pageable]
        stats.append(
            stat(
                kind,
                combine(g.durations for g in items),
                whole,
                bytes=sum(g.bytes for g in items),
                pageable_count=sum(g.durations.count for g in pageable),
                pageable_ns=sum(g.durations.total_ns for g in pageable),
                pageable_bytes=sum(g.bytes for g in pageable),
            )
        )
    return _ranked(stats)


def _api_stats(calls: list[groups.ApiGroup], names: dict[int, str]) -> list[Stat]:
    by_name: dict[str, list[DurationStats]] = defaultdict(list)
    for group in calls:
        name = names.get(group.name_id, f"function #{group.name_id}")
        by_name[schema.api_name(name)].append(group.durations)
    whole = sum(g.durations.total_ns for g in calls)
    return _ranked(
        [
            stat(
                name,
                combine(items),
                whole,
                synchronising=name in schema.SYNCHRONISING_CALLS,
            )
            for name, items in by_name.items()
        ]
    )


def _seconds(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e9


def _stat_record(s: Stat, *, name: str = "name", count: str = "instances") -> dict[str, object]:
    """One summary row; ``name`` and ``count`` are the keys nsys' report would use."""
    record: dict[str, object] = {
        name: s.name,
        "total_ns": s.total_ns,
        count: s.count,
        "time_percent": round(s.time_percent, 3),
        "avg_ns": round(s.avg_ns, 1),
        "min_ns": s.min_ns,
        "max_ns": s.max_ns,
        "stddev_ns": round(s.stddev_ns, 1),
    }
    if s.bytes is not None:
        record |= {
            "bytes": s.bytes,
            "pageable_count": s.pageable_count,
            "pageable_ns": s.pageable_ns,
            "pageable_bytes": s.pageable_bytes,
        }
    return record


def _iteration_record(iteration: Iteration | None) -> dict[str, object] | None:
    if iteration is None:
        return None
    return {
        "seconds": iteration.seconds,
        "source": iteration.source,
        "nvtx_range": iteration.range_name,
        "count": iteration.count,
    }


def gpu_record(gpu: GpuTrace, top: int) -> dict[str, object]:
    kernel_ns = sum(share.total_ns for share in gpu.families)
    return {
        "device": gpu.device,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "span_seconds": gpu.span_ns / 1e9,
        "busy_fraction": gpu.busy_fraction,
        "busy_seconds": gpu.busy_ns / 1e9,
        "idle_gaps": {
            "count": gpu.gaps.count,
            "total_seconds": gpu.gaps.total_ns / 1e9,
            "longest_seconds": gpu.gaps.longest_ns / 1e9,
            "longest": [
                {"start_seconds": g.start_ns / 1e9, "seconds": g.length_ns / 1e9}
                for g in gpu.longest_gaps
            ],
            "large_count": gpu.gaps.large_count,
            "large_total_seconds": gpu.gaps.large_ns / 1e9,
            "during_sync_count": gpu.sync_gap_count,
            "during_sync_seconds": gpu.sync_gap_ns / 1e9,
        },
        "kernels": [_stat_record(s) for s in gpu.kernels[:top]],
        "kernel_names": len(gpu.kernels),
        "memory_ops": [_stat_record(s, name="kind", count="count") for s in gpu.memory],
        "launch_calls": gpu.launches,
        "launch_api_seconds": gpu.launch_ns / 1e9,
        "sync_calls": gpu.sync_calls,
        "sync_api_seconds": gpu.sync_ns / 1e9,
        "iteration": _iteration_record(gpu.iteration),
        "verdict": gpu.verdict.name,
        "evidence": gpu.verdict.evidence,
        "advice": gpu.verdict.advice,
        "shares": {f.verdict: round(f.share, 4) for f in gpu.verdict.findings},
        "families": [
            {
                "family": share.family,
                "label": share.label,
                "total_ns": share.total_ns,
                "instances": share.instances,
                "time_percent": round(share.percent_of(kernel_ns), 3),
                "kernel_names": share.names,
            }
            for share in gpu.families
        ],
        "reading": gpu.reading,
        "communication": {
            "total_ns": gpu.communication_ns,
            "exposed_ns": gpu.exposed_communication_ns,
        },
    }


def to_json(summary: TraceSummary, *, top: int = 10) -> dict[str, object]:
    """The ``--output json`` object (keys documented in docs/trace.md; existing keys stay)."""
    return {
        "kind": "trace",
        "format_version": TRACE_FORMAT_VERSION,
        "report": summary.report,
        "schema_version": summary.schema_version,
        "nsight_systems_version": summary.product_version,
        "started_at": summary.started_at.isoformat().replace("+00:00", "Z")
        if summary.started_at
        else None,
        "span_seconds": summary.span_ns / 1e9,
        "iteration_seconds": summary.iteration.seconds if summary.iteration else None,
        "iteration": _iteration_record(summary.iteration),
        "profiler_period_seconds": summary.profiler_period_seconds,
        "gpus": [gpu_record(gpu, top) for gpu in summary.gpus],
        "cuda_api": [
            {**_stat_record(s, count="calls"), "synchronising": s.synchronising}
            for s in summary.api
        ],
        "warnings": summary.warnings,
    }
