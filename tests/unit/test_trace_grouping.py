"""Grouping without sorting (``profiler_app.trace.grouping``) and its general fallbacks.

Reports are built with ``tests.support.nsys.ReportBuilder`` (test doubles of Nsight Systems
exports, documented schema 3.16.1; no GPU or nsys here). The fast path packs each group's
columns into one integer key, exactly (processes by their slot, so two processes with the same
24-bit pid on different virtual machines stay apart); exports beyond the key's bounds (a device
id over 255, a kernel's process that made no CUDA API call, more than 64 calling processes,
correlation ids beyond 32 bits) must give the same figures through the slower general queries.
``grouping.aggregate`` is wrapped (a spy, not a stand-in: it runs unchanged) to prove which
path ran.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler_app.trace import grouping, queries
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import TraceSummary, summarise, to_json
from tests.support.nsys import PID, ReportBuilder

US = 1_000
MS = 1_000_000
OTHER_VM = PID + (1 << 24)  # the same 24-bit process id, serialised with VM id 1 above it


@pytest.fixture
def fast_paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """table -> whether its packed-key aggregation succeeded, for the summaries run."""
    outcomes: dict[str, bool] = {}
    original = grouping.aggregate

    def spy(*args: object, **kwargs: object) -> bool:
        outcomes[str(kwargs["table"])] = result = original(*args, **kwargs)  # type: ignore[arg-type]
        return result

    monkeypatch.setattr(grouping, "aggregate", spy)
    return outcomes


def summary_of(path: Path) -> TraceSummary:
    with open_report(str(path)) as export:
        return summarise(export)


def test_groups_are_the_same_in_any_row_order_on_the_fast_path(
    tmp_path: Path, fast_paths: dict[str, bool]
) -> None:
    rng = np.random.default_rng(4)
    report = ReportBuilder(gpus={0: "a", 1: "b"})
    for device, pid in ((0, 100), (1, 200)):
        starts = np.cumsum(rng.integers(10 * US, MS, 500))
        report.add_kernels(
            "gemm", starts, rng.integers(5 * US, 900 * US, 500), device=device, pid=pid
        )
        report.add_kernels("relu", starts + 2 * US, 3 * US, device=device, pid=pid, stream=8)
    ordered = to_json(summary_of(report.write(tmp_path / "ordered.sqlite", shuffle=False)))
    shuffled = to_json(summary_of(report.write(tmp_path / "shuffled.sqlite")))
    assert {**shuffled, "report": None} == {**ordered, "report": None}
    assert set(fast_paths.values()) == {True}
    gpus = summary_of(tmp_path / "shuffled.sqlite").gpus
    assert [(g.launches, g.launch_ns) for g in gpus] == [(1000, 1000 * 4 * US)] * 2
    assert [[(k.name, k.count) for k in g.kernels] for g in gpus] == [
        [("gemm", 500), ("relu", 500)]
    ] * 2


def test_processes_sharing_a_24_bit_pid_are_grouped_apart(
    tmp_path: Path, fast_paths: dict[str, bool]
) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [0, 2 * MS], MS, launch_ns=3 * US, pid=PID)
    report.next_correlation = 1  # each process numbers its own calls
    report.add_kernels("k", [4 * MS], 2 * MS, launch=None, pid=OTHER_VM)
    launch = "cudaLaunchKernel_v7000"
    report.add_api_calls(launch, [3 * MS], [3 * MS + 7 * US], [1], pid=OTHER_VM, thread=PID)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    # both keyed by the process's slot among the callers: exact, so no clash
    assert fast_paths["temp.trace_kernel_groups"] is True
    assert fast_paths["temp.trace_api_groups"] is True
    gpu = result.gpus[0]
    (kernel,) = gpu.kernels
    assert (kernel.count, kernel.total_ns, kernel.min_ns, kernel.max_ns) == (3, 4 * MS, MS, 2 * MS)
    # each kernel found its own process's call, although both processes used ids 1 and 2
    assert (gpu.launches, gpu.launch_ns) == (3, 2 * 3 * US + 7 * US)
    (api,) = result.api
    assert (api.name, api.count, api.total_ns) == ("cudaLaunchKernel", 3, 13 * US)
    with open_report(str(tmp_path / "r.sqlite")) as export:
        callers = queries.api_callers(export)
        groups = queries.api_groups(export, callers)
        kernels = queries.kernel_groups(export, 0, callers)
    assert sorted((g.pid, g.durations.count) for g in groups) == [
        (PID << 24, 2),
        (OTHER_VM << 24, 1),
    ]
    assert sorted((g.pid, g.durations.count, g.launches) for g in kernels) == [
        (PID << 24, 2, 2),
        (OTHER_VM << 24, 1, 1),
    ]


@pytest.mark.parametrize("outside", ["device id over 255", "process without API calls"])
def test_kernels_outside_the_key_bounds_are_grouped_the_general_way(
    tmp_path: Path, fast_paths: dict[str, bool], outside: str
) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [0, 2 * MS], MS, launch_ns=3 * US)
    if outside == "device id over 255":
        report.add_kernels("k", [4 * MS], 2 * MS, device=300, launch_ns=5 * US)
    else:
        report.add_kernels("k", [4 * MS], 2 * MS, launch=None, pid=PID + 1)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    assert fast_paths["temp.trace_kernel_groups"] is False
    figures = [
        (gpu.device, [(k.count, k.total_ns) for k in gpu.kernels], gpu.launches, gpu.launch_ns)
        for gpu in result.gpus
    ]
    if outside == "device id over 255":
        assert figures == [(0, [(2, 2 * MS)], 2, 6 * US), (300, [(1, 2 * MS)], 1, 5 * US)]
    else:
        assert figures == [(0, [(3, 4 * MS)], 2, 6 * US)]


def test_api_calls_of_more_processes_than_slots_are_grouped_the_general_way(
    tmp_path: Path, fast_paths: dict[str, bool]
) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [0], MS, launch_ns=2 * US)
    for pid in range(1000, 1065):  # 65 processes, one more than the slots
        report.add_api_calls("cudaMemGetInfo_v3020", [2 * MS], [2 * MS + pid], pid=pid)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    assert "temp.trace_api_groups" not in fast_paths
    calls = {s.name: (s.count, s.total_ns, s.min_ns, s.max_ns) for s in result.api}
    assert calls == {
        "cudaMemGetInfo": (65, sum(range(1000, 1065)), 1000, 1064),
        "cudaLaunchKernel": (1, 2 * US, 2 * US, 2 * US),
    }


def test_correlation_ids_beyond_32_bits_are_joined_the_general_way(
    tmp_path: Path, fast_paths: dict[str, bool]
) -> None:
    report = ReportBuilder()
    report.next_correlation = (1 << 32) - 1
    report.add_kernels("k", [0, 2 * MS, 4 * MS], MS, launch_ns=5 * US)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert "temp.trace_launch" not in fast_paths  # never built: the ids do not fit its key
    assert (gpu.launches, gpu.launch_ns) == (3, 15 * US)


def test_a_kernel_counts_once_when_two_calls_share_its_correlation_id(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [10 * MS], MS, launch_ns=4 * US)
    # a second call recorded with the kernel's id (e.g. the driver call under the runtime's)
    report.add_api_calls("cuLaunchKernel", [10 * MS - 4 * US], [10 * MS - 3 * US], [1])
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert [(k.name, k.count, k.total_ns) for k in gpu.kernels] == [("k", 1, MS)]
    assert (gpu.launches, gpu.launch_ns) == (2, 5 * US)
