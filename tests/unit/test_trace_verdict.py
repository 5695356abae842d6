"""Verdicts: the pure rules of ``profiler_app.trace.verdict``, then whole reports whose timeline
shows each bottleneck (reports built by ``tests.support.nsys.builder.ReportBuilder``, a test
double of Nsight Systems exports: no GPU or nsys here).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from profiler_app.trace import verdict
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import GpuTrace, summarise
from profiler_app.trace.verdict import GpuFigures, judge
from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.schema import HTOD, PAGEABLE

US = 1_000
MS = 1_000_000
SECOND = 1_000_000_000

# A healthy GPU: busy 95 % of 10 s with 2 ms kernels, no copies, no syncs.
BUSY = GpuFigures(
    span_ns=10 * SECOND,
    busy_ns=int(9.5 * SECOND),
    kernel_count=4750,
    kernel_ns=int(9.5 * SECOND),
    short_kernels=0,
    launch_ns=4750 * 5 * US,
    memory_ns=0,
    memory_count=0,
    pageable_ns=0,
    pageable_count=0,
    large_gap_count=0,
    large_gap_ns=0,
    sync_gap_ns=0,
    sync_calls=0,
    sync_ns=0,
    idle_ns=int(0.5 * SECOND),
)


def test_a_busy_gpu_with_long_kernels_is_compute_bound() -> None:
    result = judge(BUSY)
    assert result.name == "compute-bound"
    assert result.evidence == ["the GPU is busy 95.0% of 10.00 s; kernels average 2.0 ms"]
    assert result.advice == verdict.ADVICE["compute-bound"]


def test_large_gaps_make_it_input_bound_with_gaps_per_iteration() -> None:
    figures = replace(
        BUSY,
        busy_ns=6 * SECOND,
        kernel_ns=6 * SECOND,
        idle_ns=4 * SECOND,
        large_gap_count=100,
        large_gap_ns=int(3.5 * SECOND),
        iteration_ns=100 * MS,
    )
    result = judge(figures)
    assert result.name == "input-bound"
    assert result.evidence[0] == (
        "100 idle gaps of 1.0 ms or more (1.0 per iteration) hold 35.0% of the span (3.50 s); "
        "the GPU is busy 60.0%"
    )


def test_input_needs_a_pattern_of_gaps_not_one_pause() -> None:
    one_pause = replace(
        BUSY, busy_ns=7 * SECOND, idle_ns=3 * SECOND, large_gap_count=2, large_gap_ns=3 * SECOND
    )
    finding = next(f for f in judge(one_pause).findings if f.verdict == "input-bound")
    assert not finding.fired


def test_many_short_kernels_with_costly_launches_are_launch_bound() -> None:
    figures = replace(
        BUSY,
        kernel_count=500_000,
        short_kernels=450_000,
        kernel_ns=4 * SECOND,
        busy_ns=4 * SECOND,
        launch_ns=3 * SECOND,
        idle_ns=6 * SECOND,
    )
    result = judge(figures)
    assert result.name == "launch-bound"
    assert "90% of 500,000 kernels run under 20.0 us" in result.evidence[0]
    assert "0.75x the kernel time" in result.evidence[0]


def test_copies_or_pageable_memory_make_it_transfer_bound() -> None:
    copies = replace(BUSY, memory_ns=3 * SECOND, memory_count=300)
    assert judge(copies).name == "compute-bound"  # busy 95 %: compute's 95 % share wins
    mostly_copies = replace(copies, memory_ns=6 * SECOND, kernel_ns=int(3.5 * SECOND))
    assert judge(mostly_copies).name == "transfer-bound"  # 60 % of the span beats 35 %
    pageable = replace(
        BUSY, busy_ns=5 * SECOND, memory_ns=SECOND, pageable_ns=SECOND // 2, pageable_count=40
    )
    finding = next(f for f in judge(pageable).findings if f.verdict == "transfer-bound")
    assert finding.fired  # 5 % of the span in pageable copies is enough
    assert "40 copies use pageable host memory (500.0 ms, 5.0%)" in finding.evidence


def test_short_gaps_after_synchronising_calls_make_it_sync_bound() -> None:
    figures = replace(
        BUSY,
        busy_ns=7 * SECOND,
        idle_ns=3 * SECOND,
        sync_gap_ns=int(2.5 * SECOND),
        sync_calls=5000,
        sync_ns=6 * SECOND,
    )
    result = judge(figures)
    assert result.name == "sync-bound"
    assert result.evidence[0] == (
        "the host waited 6.00 s in 5,000 synchronising calls; idle gaps that began during "
        "them hold 25.0% of the span"
    )
    few_calls = replace(figures, sync_calls=2)
    assert judge(few_calls).name != "sync-bound"


def test_the_largest_share_wins_and_the_others_are_listed() -> None:
    figures = replace(
        BUSY,
        busy_ns=5 * SECOND,
        kernel_ns=4 * SECOND,
        memory_ns=SECOND,
        memory_count=50,
        pageable_ns=SECOND,
        pageable_count=50,
        idle_ns=5 * SECOND,
        large_gap_count=40,
        large_gap_ns=4 * SECOND,
    )
    result = judge(figures)
    assert result.name == "input-bound"  # 40 % of the span beats the copies' 10 %
    assert result.evidence[1].startswith("also transfer-bound: 50 copies and memsets take 10.0%")
    assert len(result.evidence) == 2


def test_with_no_rule_fired_the_largest_share_is_named_and_said_so() -> None:
    middling = replace(
        BUSY, busy_ns=7 * SECOND, kernel_ns=7 * SECOND, idle_ns=3 * SECOND, large_gap_count=0
    )
    # busy 70 % < 80 %: not compute-bound; 30 % idle in short gaps after no sync: launch fires
    assert judge(middling).name == "launch-bound"
    quiet = replace(
        middling,
        busy_ns=int(8.5 * SECOND),
        idle_ns=int(1.5 * SECOND),
        kernel_ns=int(8.5 * SECOND),
        kernel_count=8_500_000,
    )
    result = judge(quiet)  # 1 us kernels: not "long", and 15 % short idle is under 20 %
    assert not any(f.fired for f in result.findings)
    assert result.name == "compute-bound"
    assert result.evidence[-1].startswith("no rule reached its threshold")


# Whole reports, one per bottleneck.


def gpu_of(report: ReportBuilder, path: Path) -> GpuTrace:
    with open_report(str(report.write(path))) as export:
        return summarise(export).gpus[0]


def test_report_compute_bound(tmp_path: Path) -> None:
    report = ReportBuilder()
    starts = np.arange(400) * 2010 * US  # 2 ms kernels, 10 us apart
    report.add_kernels("volta_sgemm_128x64_nn", starts, 2 * MS)
    gpu = gpu_of(report, tmp_path / "r.sqlite")
    assert gpu.verdict.name == "compute-bound"
    assert gpu.busy_fraction == pytest.approx(2000 / 2010, abs=1e-4)


def test_report_input_bound(tmp_path: Path) -> None:
    report = ReportBuilder()
    for step in range(40):  # 10 ms of kernels, then 15 ms waiting for the next batch
        base = step * 25 * MS
        report.add_kernels("fwd", base + np.arange(10) * MS, 990 * US)
        report.add_copies(HTOD, [base - 200 * US], 100 * US, 1 << 20)
    gpu = gpu_of(report, tmp_path / "r.sqlite")
    assert gpu.verdict.name == "input-bound"
    assert gpu.gaps.large_count == 39
    assert gpu.iteration is not None
    assert gpu.iteration.seconds == pytest.approx(0.025, rel=0.02)


def test_report_launch_bound(tmp_path: Path) -> None:
    report = ReportBuilder()
    starts = np.arange(20_000) * 12 * US  # 4 us kernels every 12 us, 8 us launch calls
    report.add_kernels("elementwise_add", starts, 4 * US, launch_ns=8 * US, launch_lead_ns=US)
    gpu = gpu_of(report, tmp_path / "r.sqlite")
    assert gpu.verdict.name == "launch-bound"
    assert (gpu.launches, gpu.launch_ns) == (20_000, 20_000 * 8 * US)


def test_report_transfer_bound_with_pageable_copies(tmp_path: Path) -> None:
    report = ReportBuilder()
    for step in range(50):
        base = step * 5 * MS
        report.add_copies(HTOD, [base], 3 * MS, 64 << 20, host_kind=PAGEABLE)
        report.add_kernels("train", [base + 3 * MS + 10 * US], 1900 * US)
    gpu = gpu_of(report, tmp_path / "r.sqlite")
    assert gpu.verdict.name == "transfer-bound"
    assert "50 copies use pageable host memory" in gpu.verdict.evidence[0]


def test_report_sync_bound(tmp_path: Path) -> None:
    report = ReportBuilder()
    starts = np.arange(300) * 2600 * US
    report.add_kernels("layer", starts, 2 * MS)
    # .item() after every layer: the host blocks until the kernel ends, then takes 0.6 ms
    report.add_api_calls("cudaStreamSynchronize_v3020", starts + 10 * US, starts + 2 * MS + 3 * US)
    gpu = gpu_of(report, tmp_path / "r.sqlite")
    assert gpu.verdict.name == "sync-bound"
    assert gpu.sync_calls == 300
    assert gpu.sync_gap_count == 299


def test_report_mixed_input_gaps_and_pageable_copies(tmp_path: Path) -> None:
    report = ReportBuilder()
    for step in range(30):
        base = step * 40 * MS
        report.add_copies(HTOD, [base], 4 * MS, 16 << 20, host_kind=PAGEABLE)
        report.add_kernels("train", base + 4 * MS + np.arange(16) * MS, 990 * US)
        # then 20 ms of idle: the next batch is still being decoded on the CPU
    gpu = gpu_of(report, tmp_path / "r.sqlite")
    shares = {f.verdict: f for f in gpu.verdict.findings}
    assert shares["input-bound"].fired
    assert shares["transfer-bound"].fired
    assert gpu.verdict.name == "input-bound"  # 20 of 40 ms idle outweighs 4 ms of copies
    assert any(line.startswith("also transfer-bound") for line in gpu.verdict.evidence)
