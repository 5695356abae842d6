"""The per-GPU figures of ``profiler_app.trace.summary`` on reports with known timelines.

Reports are built with ``tests.support.nsys.builder.ReportBuilder``: test doubles of Nsight
Systems exports (documented schema 3.16.1 tables and enum values), since no GPU or nsys exists
here.
Expected figures are worked out by hand from each timeline in the test.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from profiler_app.trace import events, iterations, timeline
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import TraceSummary, summarise, to_json
from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.schema import DTOD, DTOH, HTOD, MEMCPY, MEMSET, NVTX, PAGEABLE, RUNTIME

US = 1_000
MS = 1_000_000


def summary_of(path: Path, **options: Any) -> TraceSummary:
    with open_report(str(path)) as export:
        return summarise(export, **options)


def test_overlapping_streams_count_once_in_the_busy_time(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_kernels("a", [0, 20 * MS], 10 * MS, stream=7)
    report.add_kernels("b", [5 * MS], 20 * MS, stream=8)  # overlaps both kernels of stream 7
    report.add_copies(HTOD, [40 * MS], 5 * MS, 1 << 20, stream=9)
    report.add_memsets([44 * MS], 6 * MS, 4096, stream=10)  # overlaps the copy
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    # Union [0, 30) and [40, 50) ms: 40 of 50 ms. Summed durations would be 51 ms.
    assert (gpu.first_ns, gpu.last_ns) == (0, 50 * MS)
    assert gpu.busy_ns == 40 * MS
    assert gpu.busy_fraction == pytest.approx(0.8)
    assert (gpu.gaps.count, gpu.gaps.total_ns, gpu.gaps.longest_ns) == (1, 10 * MS, 10 * MS)
    assert [(g.start_ns, g.length_ns) for g in gpu.longest_gaps] == [(30 * MS, 10 * MS)]
    assert sum(k.total_ns for k in gpu.kernels) == 40 * MS


def varied_report() -> ReportBuilder:
    rng = np.random.default_rng(3)
    report = ReportBuilder(gpus={0: "GPU zero", 1: "GPU one"})
    for device in (0, 1):
        starts = np.cumsum(rng.integers(20 * US, 3 * MS, 300))
        report.add_kernels("gemm", starts, rng.integers(5 * US, 2 * MS, 300), device=device)
        report.add_kernels("relu", starts + 10 * US, rng.integers(2 * US, 30 * US, 300), stream=8)
        report.add_copies(HTOD, starts[::10], 200 * US, 1 << 22, device=device, host_kind=PAGEABLE)
    report.add_api_calls("cudaStreamSynchronize_v3020", [5 * MS, 90 * MS], [6 * MS, 95 * MS])
    report.add_ranges("step", np.arange(0, 600 * MS, 30 * MS), 25 * MS)
    return report


def test_rows_in_any_order_give_the_same_summary(tmp_path: Path) -> None:
    report = varied_report()
    ordered = to_json(summary_of(report.write(tmp_path / "ordered.sqlite", shuffle=False)))
    for seed in (1, 2):
        path = report.write(tmp_path / f"shuffled{seed}.sqlite", seed=seed)
        shuffled = to_json(summary_of(path))
        assert {**shuffled, "report": None} == {**ordered, "report": None}
    assert [gpu["device"] for gpu in ordered["gpus"]] == [0, 1]  # type: ignore[index]


def test_the_five_longest_gaps_with_their_start_times(tmp_path: Path) -> None:
    gaps = [3, 9, 1, 7, 2, 8, 5]  # ms of idle after each kernel
    starts = np.cumsum([0] + [MS + g * MS for g in gaps])
    report = ReportBuilder()
    report.add_kernels("k", starts, MS)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert gpu.gaps.count == 7
    assert gpu.gaps.total_ns == sum(gaps) * MS
    assert gpu.gaps.longest_ns == 9 * MS
    expected = sorted(
        ((int(starts[i]) + MS, g * MS) for i, g in enumerate(gaps)), key=lambda x: -x[1]
    )[:5]
    assert [(g.start_ns, g.length_ns) for g in gpu.longest_gaps] == expected
    assert gpu.gaps.large_count == 7  # every gap is at least 1 ms


def test_kernel_statistics_are_the_nsys_columns(tmp_path: Path) -> None:
    durations = [4 * US, 7 * US, 7 * US, 30 * US, 52 * US]
    report = ReportBuilder()
    starts = np.arange(5) * 100 * US
    report.add_kernels("void scale<float>(float *, int)", starts, durations)
    report.add_kernels("single", [MS], 200 * US)
    kernels = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0].kernels
    assert [k.name for k in kernels] == ["single", "void scale<float>(float *, int)"]
    single, scale = kernels
    assert (single.count, single.total_ns, single.stddev_ns) == (1, 200 * US, 0.0)
    assert scale.count == 5
    assert scale.total_ns == sum(durations)
    assert scale.avg_ns == pytest.approx(statistics.mean(durations))
    assert (scale.min_ns, scale.max_ns) == (4 * US, 52 * US)
    assert scale.stddev_ns == pytest.approx(statistics.stdev(durations))  # sample, as nsys
    assert scale.time_percent == pytest.approx(100 * sum(durations) / (sum(durations) + 200 * US))


def test_memory_operations_by_kind_with_pageable_copies_flagged(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_copies(HTOD, [0, MS], 100 * US, 1000)  # pinned
    report.add_copies(HTOD, [2 * MS, 3 * MS, 4 * MS], 300 * US, 2000, host_kind=PAGEABLE)
    report.add_copies(DTOH, [5 * MS], 50 * US, 10, host_kind=PAGEABLE)
    report.add_copies(DTOD, [6 * MS], 30 * US, 1 << 20)
    report.add_memsets([7 * MS, 8 * MS], 10 * US, 512)
    memory = {m.name: m for m in summary_of(report.write(tmp_path / "r.sqlite")).gpus[0].memory}
    assert list(memory) == ["HtoD", "DtoH", "DtoD", "memset"]
    htod = memory["HtoD"]
    assert (htod.count, htod.total_ns, htod.bytes) == (5, 1100 * US, 8000)
    assert (htod.pageable_count, htod.pageable_ns, htod.pageable_bytes) == (3, 900 * US, 6000)
    assert (memory["DtoH"].pageable_count, memory["DtoH"].bytes) == (1, 10)
    assert memory["DtoD"].pageable_count == 0
    assert (memory["memset"].count, memory["memset"].bytes) == (2, 1024)
    assert sum(m.time_percent for m in memory.values()) == pytest.approx(100.0)


def test_api_names_lose_their_version_and_synchronising_calls_are_marked(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_kernels("k", [10 * MS, 20 * MS], MS)  # two cudaLaunchKernel_v7000 of 4 us
    report.add_api_calls("cudaStreamSynchronize_v3020", [11 * MS], [12 * MS])
    report.add_api_calls("cudaMemGetInfo_v3020", [0], [3 * MS])
    report.add_api_calls("cudaMalloc_v3020", [1 * MS], [1 * MS + 500 * US])
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    api = {s.name: s for s in result.api}
    assert list(api) == [
        "cudaMemGetInfo",
        "cudaStreamSynchronize",
        "cudaMalloc",
        "cudaLaunchKernel",
    ]
    assert api["cudaLaunchKernel"].count == 2
    assert [name for name, s in api.items() if s.synchronising] == [
        "cudaMemGetInfo",
        "cudaStreamSynchronize",
    ]
    gpu = result.gpus[0]
    assert (gpu.sync_calls, gpu.sync_ns) == (2, 4 * MS)
    assert (gpu.launches, gpu.launch_ns) == (2, 8 * US)


def test_missing_optional_tables_are_normal(tmp_path: Path) -> None:
    report = ReportBuilder(session_start_utc_ns=None)
    report.add_kernels("k", [0, 2 * MS], MS)
    path = report.write(
        tmp_path / "r.sqlite",
        omit=[RUNTIME, MEMCPY, MEMSET, NVTX, "TARGET_INFO_GPU", "ENUM_CUDA_MEMCPY_OPER"],
    )
    result = summary_of(path)
    assert result.started_at is None
    assert result.api == []
    assert result.iteration is None
    gpu = result.gpus[0]
    assert (gpu.name, gpu.uuid, gpu.launches, gpu.memory) == (None, None, 0, [])
    assert gpu.busy_fraction == pytest.approx(2 / 3)


def test_a_report_without_kernels(tmp_path: Path) -> None:
    report = ReportBuilder()
    report.add_copies(HTOD, np.arange(10) * 2 * MS, MS, 1 << 24, host_kind=PAGEABLE)
    gpu = summary_of(report.write(tmp_path / "copies.sqlite")).gpus[0]
    assert gpu.kernels == []
    assert gpu.busy_fraction == pytest.approx(10 / 19)
    assert gpu.verdict.name == "transfer-bound"
    empty = ReportBuilder()
    empty.add_api_calls("cudaGetDeviceCount_v3020", [0], [10 * US])
    result = summary_of(empty.write(tmp_path / "empty.sqlite"))
    assert result.gpus == []
    assert result.span_ns == 0
    assert [s.name for s in result.api] == ["cudaGetDeviceCount"]


def test_launches_join_their_kernels_within_the_same_process(tmp_path: Path) -> None:
    report = ReportBuilder(gpus={0: "a", 1: "b"})
    report.add_kernels("k", [10 * MS], MS, device=0, launch_ns=3 * US, pid=100)
    report.next_correlation = 1  # each process numbers its own calls: the ids collide
    report.add_kernels("k", [10 * MS], MS, device=1, launch_ns=9 * US, pid=200)
    gpus = summary_of(report.write(tmp_path / "r.sqlite")).gpus
    assert [(g.launches, g.launch_ns) for g in gpus] == [(1, 3 * US), (1, 9 * US)]


def test_a_cuda_graph_launch_is_counted_once_for_all_its_kernels(tmp_path: Path) -> None:
    report = ReportBuilder()
    for step in range(3):
        base = step * 10 * MS
        report.add_graph(
            ["fwd", "bwd"] * 50,
            base + np.arange(100) * 50 * US,
            40 * US,
            launch_start=base - 100 * US,
            launch_ns=60 * US,
        )
    report.add_kernels("optimizer", [35 * MS], MS, launch_ns=5 * US)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert sum(k.count for k in gpu.kernels) == 301
    assert gpu.launches == 1  # the kernel launched on its own
    assert gpu.launch_ns == 3 * 60 * US + 5 * US  # not 100 x 60 us per graph


def test_short_gaps_that_begin_during_a_sync_call_are_counted(tmp_path: Path) -> None:
    report = ReportBuilder()
    starts = np.arange(10) * 3 * MS
    report.add_kernels("k", starts, 2 * MS)
    # The host waits for each kernel, then the GPU idles until the host's next launch.
    report.add_api_calls("cudaStreamSynchronize_v3020", starts + 100 * US, starts + 2 * MS + 5 * US)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    # 1 ms gaps are large (input-like) gaps: they are not counted as short gaps after syncs.
    assert (gpu.gaps.count, gpu.gaps.large_count, gpu.sync_gap_count) == (9, 9, 0)
    report2 = ReportBuilder()
    starts = np.arange(10) * 2500 * US
    report2.add_kernels("k", starts, 2 * MS)
    report2.add_api_calls("cudaStreamSynchronize_v3020", starts, starts + 2 * MS + 5 * US)
    gpu = summary_of(report2.write(tmp_path / "r2.sqlite")).gpus[0]
    assert (gpu.sync_gap_count, gpu.sync_gap_ns) == (9, 9 * 500 * US)


def test_iterations_come_from_the_nvtx_range_that_tiles_the_run(tmp_path: Path) -> None:
    report = ReportBuilder()
    steps = np.arange(20) * 25 * MS
    report.add_kernels("k", steps + MS, 20 * MS)
    report.add_ranges("train_step", steps, 24 * MS, registered=True)
    report.add_ranges("epoch", [0, 170 * MS, 340 * MS], 160 * MS)
    report.add_ranges("aten::mm", np.arange(200) * 2 * MS, 100 * US)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    assert result.iteration is not None
    assert dataclasses.astuple(result.iteration) == (0.025, "nvtx", "train_step", 20)
    assert result.gpus[0].iteration == result.iteration
    chosen = summary_of(tmp_path / "r.sqlite", iteration_range="epoch").iteration
    assert chosen is not None
    assert (chosen.range_name, chosen.seconds) == ("epoch", 0.17)


def test_without_nvtx_the_kernel_sequence_gives_the_period(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    report = ReportBuilder()
    period = 40 * MS
    for step in range(60):
        base = step * period + int(rng.integers(0, 200 * US))
        # forward, backward, optimizer: 30 ms of kernels, then the input pipeline
        report.add_kernels("fwd", base + np.arange(10) * MS, 900 * US)
        report.add_kernels("bwd", base + 10 * MS + np.arange(10) * 2 * MS, 1800 * US)
        report.add_kernels("adam", [base + 30 * MS], 500 * US)
    result = summary_of(report.write(tmp_path / "r.sqlite"))
    assert result.iteration is not None
    assert result.iteration.source == "kernels"
    assert result.iteration.seconds == pytest.approx(0.040, rel=0.03)
    assert result.gpus[0].iteration == result.iteration


def test_aperiodic_kernels_have_no_iteration(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    report = ReportBuilder()
    report.add_kernels("k", np.sort(rng.integers(0, 2_000 * MS, 3000)), 50 * US)
    assert summary_of(report.write(tmp_path / "r.sqlite")).iteration is None


def test_the_busy_signal_per_bin_is_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    starts = np.sort(rng.integers(0, 50 * MS, 400))
    lengths = rng.integers(10 * US, 400 * US, 400)
    report = ReportBuilder()
    report.add_kernels("a", starts[::2], lengths[::2], stream=7)
    report.add_kernels("b", starts[1::2], lengths[1::2], stream=8)  # overlaps stream 7 at times
    with open_report(str(report.write(tmp_path / "r.sqlite"))) as export:
        summary = summarise(export)
        kernels = events.load(export).kernels
    gpu = summary.gpus[0]
    gaps = timeline.build(
        kernels.device, kernels.start, kernels.end, summary.origin_ns, summary.span_ns
    ).of(0)
    width = gpu.span_ns // iterations.FINE_BINS
    idle = gaps.idle_by_bin(gpu.first_ns - summary.origin_ns, width, iterations.FINE_BINS)
    busy = iterations.busy_signal(idle, width)
    # Brute force: every busy nanosecond of the GPU's span, summed per bin
    timeline_ns = np.zeros(iterations.FINE_BINS * width, dtype=bool)
    for start, length in zip(starts - gpu.first_ns, lengths, strict=True):
        timeline_ns[max(start, 0) : start + length] = True
    expected = timeline_ns.reshape(iterations.FINE_BINS, width).sum(axis=1)
    assert np.array_equal(busy, expected.astype(np.float64))
