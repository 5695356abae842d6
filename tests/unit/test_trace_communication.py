"""The ``communication-bound`` verdict: its pure rule, then whole reports with NCCL kernels.

Reports are built by ``tests.support.nsys.builder.ReportBuilder`` (a test double of Nsight
Systems exports: no GPU, NCCL or nsys here); its NCCL kernels carry the names and the launch call
(``cuLaunchKernelEx``) of a real PyTorch capture on two H100s and of public NCCL profiles.
Timelines are worked out by hand in each test.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from profiler_app.trace import verdict
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import GpuTrace, TraceSummary, summarise, to_json
from profiler_app.trace.verdict import GpuFigures, judge
from tests.support.nsys.builder import (
    NCCL_ALL_REDUCE,
    NCCL_OLD_ALL_REDUCE,
    NCCL_SEND_RECV,
    ReportBuilder,
)

US = 1_000
MS = 1_000_000
SECOND = 1_000_000_000
GEMM = "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_execute_kernel__5x_cublas"
FLASH = "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false>>()"

# Busy 95 % of 10 s, of which 3 s only NCCL kernels (4 s of NCCL kernels in all).
WAITING = GpuFigures(
    span_ns=10 * SECOND,
    busy_ns=int(9.5 * SECOND),
    kernel_count=5000,
    kernel_ns=10 * SECOND,
    short_kernels=0,
    launch_ns=5000 * 5 * US,
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
    communication_ns=4 * SECOND,
    communication_count=250,
    exposed_communication_ns=3 * SECOND,
    top_collective="ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
)


def test_compute_waiting_on_collectives_is_communication_bound() -> None:
    result = judge(WAITING)
    assert result.name == "communication-bound"
    assert result.evidence[0] == (
        "250 NCCL kernels take 4.00 s, 40.0% of the span, mostly "
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL; for 30.0% of the span (3.00 s) nothing else "
        "ran beside them: compute waited on communication"
    )
    assert "bucket" in result.advice
    assert "NVLink" in result.advice
    # compute leaves out the time the GPU only communicated (busy 65 %: not fired) and the
    # NCCL kernels (6 s of compute kernels: a share of 60 %)
    compute = next(f for f in result.findings if f.verdict == "compute-bound")
    assert not compute.fired
    assert compute.share == pytest.approx(0.6)


def test_exposed_communication_fires_from_a_fifth_of_the_span() -> None:
    def fired(exposed: float, total: float) -> bool:
        figures = replace(
            WAITING,
            exposed_communication_ns=int(exposed * SECOND),
            communication_ns=int(total * SECOND),
        )
        finding = next(f for f in judge(figures).findings if f.verdict == "communication-bound")
        return finding.fired

    assert fired(2.0, 2.0)
    assert not fired(1.99, 1.99)
    assert fired(0.0, 4.0)  # hidden behind compute, but 40 % of the span
    assert not fired(0.0, 3.99)


def test_collectives_hidden_behind_compute_leave_it_compute_bound_also_communication() -> None:
    figures = replace(WAITING, exposed_communication_ns=0, busy_ns=int(9.5 * SECOND))
    result = judge(figures)
    assert result.name == "compute-bound"
    assert result.evidence[0].startswith("the GPU is busy with compute 95.0% of 10.00 s")
    assert result.evidence[1].startswith("also communication-bound: 250 NCCL kernels take 4.00 s")


def test_without_nccl_kernels_the_rule_never_fires_and_compute_reads_as_before() -> None:
    figures = replace(
        WAITING, communication_ns=0, communication_count=0, exposed_communication_ns=0
    )
    result = judge(figures)
    assert result.name == "compute-bound"
    assert result.evidence == ["the GPU is busy 95.0% of 10.00 s; kernels average 2.0 ms"]
    assert not next(f for f in result.findings if f.verdict == "communication-bound").fired


def summary_of(path: Path) -> TraceSummary:
    with open_report(str(path)) as export:
        return summarise(export)


def data_parallel_steps(
    report: ReportBuilder,
    *,
    steps: int,
    compute_ms: int,
    collective_ms: int,
    stream: int,
    device: int = 0,
) -> None:
    """``steps`` steps of ``compute_ms`` of GEMM then attention kernels, and an all-reduce of
    ``collective_ms`` after each step's compute (on ``stream``: the compute stream 7 runs them
    one after another; another stream overlaps the all-reduce with the next step)."""
    period = (compute_ms + (collective_ms if stream == 7 else 0)) * MS
    starts = np.arange(steps) * period
    half = compute_ms * MS // 2
    report.add_kernels(GEMM, starts, half, device=device)
    report.add_kernels(FLASH, starts + half, half, device=device)
    report.add_collectives(
        NCCL_ALL_REDUCE, starts + compute_ms * MS, collective_ms * MS, stream=stream, device=device
    )


def test_all_reduce_on_the_compute_stream_makes_a_report_communication_bound(
    tmp_path: Path,
) -> None:
    report = ReportBuilder()
    data_parallel_steps(report, steps=20, compute_ms=10, collective_ms=6, stream=7)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    # each 16 ms step: 10 ms compute, 6 ms all-reduce alone; the last step ends the span
    assert gpu.exposed_communication_ns == 20 * 6 * MS
    assert gpu.communication_ns == 20 * 6 * MS
    assert gpu.verdict.name == "communication-bound"
    assert "mostly ncclDevKernel_AllReduce_Sum_bf16_RING_LL;" in gpu.verdict.evidence[0]
    assert "37.5% of the span" in gpu.verdict.evidence[0]
    assert gpu.verdict.advice == verdict.ADVICE["communication-bound"]
    assert gpu.reading == "transformer: attention + GEMM 62%; NCCL collectives 38%"
    families = {share.family: share.total_ns for share in gpu.families}
    assert families == {"gemm": 100 * MS, "attention": 100 * MS, "communication": 120 * MS}


@pytest.mark.parametrize(("collective_ms", "also"), [(6, True), (2, False)])
def test_all_reduce_overlapped_on_its_own_stream_is_hidden(
    tmp_path: Path, collective_ms: int, also: bool
) -> None:
    """Overlapped, only the last all-reduce (which ends the span) runs alone; a long one is
    still named after the verdict: 120 ms of collectives in a 206 ms span."""
    report = ReportBuilder()
    data_parallel_steps(report, steps=20, compute_ms=10, collective_ms=collective_ms, stream=20)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert gpu.communication_ns == 20 * collective_ms * MS
    assert gpu.exposed_communication_ns == collective_ms * MS
    assert gpu.verdict.name == "compute-bound"
    named = [line for line in gpu.verdict.evidence if "communication-bound" in line]
    assert bool(named) is also
    if also:
        assert "58.3% of the span" in named[0]


def test_each_gpu_of_a_data_parallel_job_gets_its_own_verdict(tmp_path: Path) -> None:
    """GPU 1 computes faster, then waits in the all-reduce for GPU 0: its NCCL kernels last
    longer (they spin until the slower rank arrives)."""
    report = ReportBuilder(gpus={0: "H100 0", 1: "H100 1"}, cuda_devices={0: 0, 1: 1})
    data_parallel_steps(report, steps=20, compute_ms=10, collective_ms=2, stream=7, device=0)
    starts = np.arange(20) * 12 * MS
    report.add_kernels(GEMM, starts, 3 * MS, device=1)
    report.add_collectives(NCCL_ALL_REDUCE, starts + 3 * MS, 9 * MS, device=1)
    gpus = summary_of(report.write(tmp_path / "r.sqlite")).gpus
    assert [(g.device, g.verdict.name) for g in gpus] == [
        (0, "compute-bound"),
        (1, "communication-bound"),
    ]
    assert gpus[1].exposed_communication_ns == 20 * 9 * MS


@pytest.mark.parametrize("name", [NCCL_SEND_RECV, NCCL_OLD_ALL_REDUCE])
def test_every_nccl_kernel_name_counts_as_communication(tmp_path: Path, name: str) -> None:
    report = ReportBuilder()
    report.add_kernels(GEMM, [0, 10 * MS], 4 * MS)
    report.add_collectives(name, [4 * MS, 14 * MS], 6 * MS)
    gpu = summary_of(report.write(tmp_path / "r.sqlite")).gpus[0]
    assert gpu.verdict.name == "communication-bound"
    assert gpu.exposed_communication_ns == 12 * MS
    assert [s.family for s in gpu.families] == ["communication", "gemm"]


def test_the_json_carries_families_reading_and_communication(tmp_path: Path) -> None:
    report = ReportBuilder()
    data_parallel_steps(report, steps=4, compute_ms=10, collective_ms=6, stream=7)
    record = to_json(summary_of(report.write(tmp_path / "r.sqlite")))["gpus"][0]  # type: ignore[index]
    assert record["verdict"] == "communication-bound"
    assert record["shares"]["communication-bound"] == pytest.approx(0.375)
    assert record["communication"] == {"total_ns": 24 * MS, "exposed_ns": 24 * MS}
    assert record["families"][0] == {
        "family": "communication",
        "label": "NCCL",
        "total_ns": 24 * MS,
        "instances": 4,
        "time_percent": 37.5,
        "kernel_names": 1,
    }
    assert record["reading"].startswith("transformer: attention + GEMM 62%")


def gpu_of(summary: TraceSummary) -> GpuTrace:
    (gpu,) = summary.gpus
    return gpu


def test_copies_beside_collectives_are_not_communication_alone(tmp_path: Path) -> None:
    """A copy running during the all-reduce keeps the GPU busy with something else."""
    report = ReportBuilder()
    report.add_kernels(GEMM, [0], 10 * MS)
    report.add_collectives(NCCL_ALL_REDUCE, [10 * MS], 10 * MS)
    report.add_copies(1, [12 * MS], 4 * MS, 1 << 20)
    gpu = gpu_of(summary_of(report.write(tmp_path / "r.sqlite")))
    assert gpu.exposed_communication_ns == 6 * MS
