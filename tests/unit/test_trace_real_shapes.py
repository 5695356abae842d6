"""Shapes of real Nsight Systems exports that a summary must read right.

Each was seen in a real export (public test data of two projects: pipit's MPI saxpy run,
Nsight Systems 2022.2, export schema 2.9.1, and CloverLeaf run, 2024.5, schema 3.13.2;
nsys-ai's PyTorch windows on two H100s, 2026.2; ``benchmarks/check_real_reports.py`` runs the
tool on them) and is rebuilt here with ``tests.support.nsys.builder.ReportBuilder``, a test
double of an export (no GPU or nsys here):

- ``nsys profile --cudabacktrace`` adds a CUDA backtrace row (event class 67) around each
  traced call, with the call's correlationId: counted as a call, every API figure doubled;
- schema 2.x names its metadata table ``EXPORT_META_DATA``;
- Nsight Systems' MPI trace writes each MPI call as an NVTX range in the ``MPI`` domain: the
  repeated ``MPI_Send`` ranges were taken for the iteration (NCCL's ``ncclGroupEnd`` likewise);
- ``TARGET_INFO_GPU.id`` is not the CUDA device id the activity rows carry (``cuDevice`` is):
  the GPU's name and UUID were another GPU's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler_app.core.errors import UserError
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import TraceSummary, summarise
from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.schema import HTOD

US = 1_000
MS = 1_000_000


def summary_of(path: Path) -> TraceSummary:
    with open_report(str(path)) as export:
        return summarise(export)


def training_steps(report: ReportBuilder, steps: int = 4, period: int = 250 * MS) -> None:
    """Per step: an input copy, three kernels, a device synchronisation."""
    for step in range(steps):
        begin = step * period
        report.add_copies(HTOD, [begin], 2 * MS, 1 << 20, api="cudaMemcpy_v3020", api_ns=3 * MS)
        report.add_kernels("saxpy", [begin + 5 * MS, begin + 25 * MS, begin + 45 * MS], 15 * MS)
        report.add_api_calls("cudaDeviceSynchronize_v3020", [begin + 60 * MS], [begin + 61 * MS])


def test_cuda_backtrace_rows_are_not_calls(tmp_path: Path) -> None:
    plain = ReportBuilder()
    training_steps(plain)
    traced = ReportBuilder()
    training_steps(traced)
    traced.add_cuda_backtraces()
    expected = summary_of(plain.write(tmp_path / "plain.sqlite"))
    summary = summary_of(traced.write(tmp_path / "backtraces.sqlite"))
    calls = {s.name: (s.count, s.total_ns) for s in summary.api}
    assert calls == {s.name: (s.count, s.total_ns) for s in expected.api}
    assert calls["cudaLaunchKernel"] == (12, 12 * 4 * US)
    assert calls["cudaMemcpy"] == (4, 4 * 3 * MS)
    gpu, reference = summary.gpus[0], expected.gpus[0]
    assert (gpu.launches, gpu.launch_ns) == (12, 12 * 4 * US)
    assert (gpu.sync_calls, gpu.sync_ns) == (reference.sync_calls, reference.sync_ns) == (4, 4 * MS)
    assert (gpu.sync_gap_count, gpu.sync_gap_ns) == (
        reference.sync_gap_count,
        reference.sync_gap_ns,
    )


def test_a_schema_2_export_is_read_with_its_version(tmp_path: Path) -> None:
    report = ReportBuilder(schema_version="2.9.1")
    training_steps(report)
    metadata = [("EXPORT_PRODUCT_VERSION", "2022.2.1.31"), ("EXPORT_SCHEMA_VERSION", "2.9.1")]
    path = report.write(
        tmp_path / "old.sqlite", metadata=metadata, metadata_table="EXPORT_META_DATA"
    )
    summary = summary_of(path)
    assert (summary.schema_version, summary.product_version) == ("2.9.1", "2022.2.1.31")
    assert summary.warnings == []
    assert summary.gpus[0].kernels[0].count == 12


@pytest.mark.parametrize("version", ["1.4.0", "4.0.0"])
def test_schema_versions_outside_2_and_3_are_refused(tmp_path: Path, version: str) -> None:
    report = ReportBuilder()
    training_steps(report, steps=1)
    metadata = [("EXPORT_SCHEMA_VERSION", version)]
    path = report.write(tmp_path / "r.sqlite", metadata=metadata, metadata_table="EXPORT_META_DATA")
    with pytest.raises(UserError, match=f"export schema version {version}"):
        summary_of(path)


def mpi_job(report: ReportBuilder) -> None:
    """A user range around each step's launches, and two MPI_Send calls and one MPI_Recv per
    step as the MPI trace writes them: longer, so they cover more of the run."""
    training_steps(report, steps=5)
    starts = [step * 250 * MS for step in range(5)]
    report.add_ranges("saxpy", [start + 4 * MS for start in starts], 50 * US)
    sends = [start + offset for start in starts for offset in (100 * MS, 111 * MS)]
    report.add_ranges("MPI_Send", sends, 11 * MS, registered=True, domain="MPI")
    report.add_ranges("MPI_Recv", [s + 180 * MS for s in starts], 20 * MS, domain="MPI")


def test_mpi_calls_traced_as_nvtx_ranges_are_not_the_iteration(tmp_path: Path) -> None:
    report = ReportBuilder()
    mpi_job(report)
    summary = summary_of(report.write(tmp_path / "mpi.sqlite"))
    assert summary.iteration is not None
    assert (summary.iteration.range_name, summary.iteration.count) == ("saxpy", 5)
    assert summary.iteration.seconds == pytest.approx(0.25)


def test_a_range_of_a_library_domain_can_still_be_asked_for(tmp_path: Path) -> None:
    report = ReportBuilder()
    mpi_job(report)
    with open_report(str(report.write(tmp_path / "mpi.sqlite"))) as export:
        summary = summarise(export, iteration_range="MPI_Send")
    assert summary.iteration is not None
    assert summary.iteration.range_name == "MPI_Send"
    assert summary.iteration.count == 10


def test_nccl_calls_are_not_the_iteration_even_without_their_domain(tmp_path: Path) -> None:
    """A capture that began after NCCL created its NVTX domain has NCCL's ranges in an unnamed
    domain (as in a real export cut to a window): their names still say what they are."""
    report = ReportBuilder()
    training_steps(report, steps=5)
    starts = [step * 250 * MS for step in range(5)]
    report.add_ranges("saxpy", [start + 4 * MS for start in starts], 50 * US)
    groups = [start + offset for start in starts for offset in (70 * MS, 90 * MS, 110 * MS)]
    report.add_ranges("ncclGroupEnd", groups, 15 * MS, registered=True)
    summary = summary_of(report.write(tmp_path / "nccl.sqlite"))
    assert summary.iteration is not None
    assert (summary.iteration.range_name, summary.iteration.count) == ("saxpy", 5)


def one_gpu_job(report: ReportBuilder, *, device: int = 0, pid: int = 4242) -> None:
    report.add_kernels("gemm", [0, 2 * MS, 4 * MS], MS, device=device, pid=pid)


def test_a_gpu_is_named_by_its_cuda_device_not_its_target_info_id(tmp_path: Path) -> None:
    """As on the real four-GPU CloverLeaf node: TARGET_INFO_GPU id 3 is CUDA device 0."""
    names = {gpu: f"GPU at id {gpu}" for gpu in range(4)}
    report = ReportBuilder(gpus=names, cuda_devices={0: 3, 3: 0, 2: 1, 1: 2})
    one_gpu_job(report)
    gpu = summary_of(report.write(tmp_path / "node.sqlite")).gpus[0]
    assert (gpu.device, gpu.name, gpu.uuid) == (0, "GPU at id 3", "GPU-00000003-test-double")


def test_each_process_cuda_device_is_mapped_to_its_gpu(tmp_path: Path) -> None:
    names = {0: "A100", 1: "H100"}
    report = ReportBuilder(gpus=names, cuda_devices={0: 0, 1: 1}, process_devices=[(4242, 0, 1)])
    one_gpu_job(report)
    summary = summary_of(report.write(tmp_path / "visible.sqlite"))
    assert (summary.gpus[0].name, summary.gpus[0].uuid) == ("H100", "GPU-00000001-test-double")
    assert summary.warnings == []


def test_processes_that_each_see_another_gpu_as_device_0_are_flagged(tmp_path: Path) -> None:
    names = {0: "H100", 1: "H100"}
    report = ReportBuilder(gpus=names, process_devices=[(4242, 0, 0), (4343, 0, 1)])
    one_gpu_job(report, pid=4242)
    one_gpu_job(report, pid=4343)
    summary = summary_of(report.write(tmp_path / "ranks.sqlite"))
    gpu = summary.gpus[0]
    assert (gpu.device, gpu.name, gpu.uuid) == (0, "H100", None)
    assert any("CUDA device 0 is a different GPU" in warning for warning in summary.warnings)
