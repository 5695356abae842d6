"""Grouping event rows with numpy (``profiler_app.trace.grouping`` and ``groups``).

Reports are built with ``tests.support.nsys.builder.ReportBuilder`` (test doubles of Nsight
Systems exports, documented schema 3.16.1; no GPU or nsys here). Keys become dense codes by a
presence table (small ranges) or by ``np.unique`` (process ids); the launch join indexes a table
by (process, correlationId) when the ids are dense, else searches a sorted array. Every shape
must give the same exact figures: two processes with the same 24-bit pid on different virtual
machines, a device id over 255, a kernel's process that made no CUDA API call, more than 64
calling processes, correlation ids beyond 32 bits or far apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler_app.trace import events, grouping, groups
from profiler_app.trace.columns import MISSING
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import TraceSummary, summarise, to_json
from tests.support.nsys.builder import PID, ReportBuilder

US = 1_000
MS = 1_000_000
OTHER_VM = PID + (1 << 24)  # the same 24-bit process id, serialised with VM id 1 above it


def summary_of(path: Path) -> TraceSummary:
    with open_report(str(path)) as export:
        return summarise(export)


def test_groups_are_the_same_in_any_row_order(tmp_path: Path) -> None:
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
    gpus = summary_of(tmp_path / "shuffled.sqlite").gpus
    assert [(g.launches, g.launch_ns) for g in gpus] == [(1000, 1000 * 4 * US)] * 2
    assert [[(k.name, k.count) for k in g.kernels] for g in gpus] == [
        [("gemm", 500), ("relu", 500)]
    ] * 2


def test_processes_sharing_a_24_bit_pid_are_grouped_apart(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [0, 2 * MS], MS, launch_ns=3 * US, pid=PID)
    report.next_correlation = 1  # each process numbers its own calls
    report.add_kernels("k", [4 * MS], 2 * MS, launch=None, pid=OTHER_VM)
    launch = "cudaLaunchKernel_v7000"
    report.add_api_calls(launch, [3 * MS], [3 * MS + 7 * US], [1], pid=OTHER_VM, thread=PID)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    gpu = result.gpus[0]
    (kernel,) = gpu.kernels
    assert (kernel.count, kernel.total_ns, kernel.min_ns, kernel.max_ns) == (3, 4 * MS, MS, 2 * MS)
    # each kernel found its own process's call, although both processes used ids 1 and 2
    assert (gpu.launches, gpu.launch_ns) == (3, 2 * 3 * US + 7 * US)
    (api,) = result.api
    assert (api.name, api.count, api.total_ns) == ("cudaLaunchKernel", 3, 13 * US)
    with open_report(str(tmp_path / "r.sqlite")) as export:
        loaded = events.load(export)
    calls = groups.api_groups(loaded.calls)
    kernels = groups.kernel_groups(loaded.kernels, loaded.calls, 0, same_process=True)
    assert sorted((g.pid, g.durations.count) for g in calls) == [
        (PID << 24, 2),
        (OTHER_VM << 24, 1),
    ]
    assert sorted((g.pid, g.durations.count, g.launches) for g in kernels) == [
        (PID << 24, 2, 2),
        (OTHER_VM << 24, 1, 1),
    ]


@pytest.mark.parametrize("outside", ["device id over 255", "process without API calls"])
def test_kernels_of_any_device_and_process_are_grouped_exactly(
    tmp_path: Path, outside: str
) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [0, 2 * MS], MS, launch_ns=3 * US)
    if outside == "device id over 255":
        report.add_kernels("k", [4 * MS], 2 * MS, device=300, launch_ns=5 * US)
    else:
        report.add_kernels("k", [4 * MS], 2 * MS, launch=None, pid=PID + 1)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    figures = [
        (gpu.device, [(k.count, k.total_ns) for k in gpu.kernels], gpu.launches, gpu.launch_ns)
        for gpu in result.gpus
    ]
    if outside == "device id over 255":
        assert figures == [(0, [(2, 2 * MS)], 2, 6 * US), (300, [(1, 2 * MS)], 1, 5 * US)]
    else:
        assert figures == [(0, [(3, 4 * MS)], 2, 6 * US)]


def test_api_calls_of_many_processes_are_grouped_exactly(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [0], MS, launch_ns=2 * US)
    for pid in range(1000, 1065):  # 65 processes, one more than the slots
        report.add_api_calls("cudaMemGetInfo_v3020", [2 * MS], [2 * MS + pid], pid=pid)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    calls = {s.name: (s.count, s.total_ns, s.min_ns, s.max_ns) for s in result.api}
    assert calls == {
        "cudaMemGetInfo": (65, sum(range(1000, 1065)), 1000, 1064),
        "cudaLaunchKernel": (1, 2 * US, 2 * US, 2 * US),
    }


def test_correlation_ids_beyond_32_bits_are_joined(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.next_correlation = (1 << 32) - 1
    report.add_kernels("k", [0, 2 * MS, 4 * MS], MS, launch_ns=5 * US)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert (gpu.launches, gpu.launch_ns) == (3, 15 * US)


def test_correlation_ids_far_apart_are_joined_by_searching(tmp_path: Path) -> None:
    """Ids spread over 32 bits make a launch table too sparse to index: it is searched."""
    report = ReportBuilder()
    for first in (5, 3_000_000_000, 4_000_000_000):
        report.next_correlation = first
        report.add_kernels("k", [first // 1000], MS, launch_ns=first % 7 + US)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert (gpu.launches, gpu.launch_ns) == (3, 3 * US + 5 + 3_000_000_000 % 7 + 4_000_000_000 % 7)


def test_factorise_by_presence_table_and_by_sorting() -> None:
    for values in (
        np.array([7, 3, 7, 9, 3], np.int64),  # a small range: presence table
        np.array([7 << 40, 3, 7 << 40, MISSING, 3], np.int64),  # a wide one: np.unique
        np.array([5, 5, 5], np.int64),
        np.empty(0, np.int64),
    ):
        codes, uniques = grouping.factorise(values)
        assert np.array_equal(uniques, np.unique(values))
        assert np.array_equal(uniques[codes], values)


def test_combine_orders_groups_by_their_keys() -> None:
    device = np.array([1, 0, 1, 0, 1], np.int64)
    process = np.array([MISSING, 5 << 24, MISSING, 6 << 24, 7 << 24], np.int64)
    name = np.array([3, 3, 3, 2, 9], np.int64)
    codes, (devices, processes, names) = grouping.combine(device, process, name)
    rows = list(zip(device.tolist(), process.tolist(), name.tolist(), strict=True))
    seen = list(zip(devices.tolist(), processes.tolist(), names.tolist(), strict=True))
    assert seen == sorted(set(rows))
    assert [seen[c] for c in codes] == rows


def test_a_kernel_counts_once_when_two_calls_share_its_correlation_id(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [10 * MS], MS, launch_ns=4 * US)
    # a second call recorded with the kernel's id (e.g. the driver call under the runtime's)
    report.add_api_calls("cuLaunchKernel", [10 * MS - 4 * US], [10 * MS - 3 * US], [1])
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert [(k.name, k.count, k.total_ns) for k in gpu.kernels] == [("k", 1, MS)]
    assert (gpu.launches, gpu.launch_ns) == (2, 5 * US)
