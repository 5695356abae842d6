"""``gpu-profiler trace`` on exports with values Nsight Systems never writes (hostile or damaged).

Reports are built by ``tests.support.nsys.builder.ReportBuilder`` (a test double of the
documented export schema; no GPU or nsys here) and then altered with ``tamper``: a real of 9e999
where a time belongs, device ids that overflow, NULL or negative device ids, NULL metadata
values. Each must end in one warning that counts the rows skipped (the rest is summarised) or
one error line with exit status 2, never a traceback or a verdict on rows no GPU ran.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler_app.cli import main
from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.files import tamper
from tests.support.nsys.schema import HTOD, KERNEL, MEMCPY, NVTX, RUNTIME

MS = 1_000_000


def steps_report(path: Path) -> Path:
    """Four 1 ms kernels 2 ms apart, a copy after them, launch calls: input-bound, 44 % busy."""
    report = ReportBuilder()
    report.add_kernels("gemm", [0, 2 * MS, 4 * MS, 6 * MS], MS)
    report.add_copies(HTOD, [8 * MS], MS, 4096)
    return report.write(path, shuffle=False)


def trace_json(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[dict[str, object], str]:
    status = main(["trace", "--store-url", "none", "--output", "json", str(path)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "Traceback" not in captured.err
    return json.loads(captured.out), captured.err


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("gpu-profiler: warning: ")]


def test_an_end_of_9e999_skips_its_row_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET end = 9e999 WHERE start = {2 * MS}",
        f"UPDATE {MEMCPY} SET end = 9e999",
        f"UPDATE {RUNTIME} SET end = 9e999 WHERE rowid = 1",
    )
    result, err = trace_json(capsys, path)
    (gpu,) = result["gpus"]  # type: ignore[misc]
    assert gpu["kernels"][0]["instances"] == 3
    assert gpu["memory_ops"] == []
    assert gpu["span_seconds"] == pytest.approx(0.007)  # 0 to 7 ms: the copy is gone
    assert sum(call["calls"] for call in result["cuda_api"]) == 4  # type: ignore[attr-defined]
    lines = warnings_of(err)
    assert len(lines) == 3
    for table, fields in (
        (KERNEL, "start, end, deviceId or name"),
        (MEMCPY, "start, end or deviceId"),
        (RUNTIME, "start, end or nameId"),
    ):
        assert any(
            f"1 row of {table} skipped: 1 with a {fields} that is NULL or not an integer" in line
            for line in lines
        ), lines


def test_times_in_reals_and_text_are_skipped_however_they_are_spelled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET start = -9e999 WHERE start = 0",
        f"UPDATE {KERNEL} SET end = '7 ms' WHERE start = {2 * MS}",
        f"UPDATE {KERNEL} SET start = x'ff00' WHERE start = {4 * MS}",
        f"UPDATE {RUNTIME} SET start = 1.5 WHERE rowid = 2",
    )
    result, err = trace_json(capsys, path)
    (gpu,) = result["gpus"]  # type: ignore[misc]
    assert gpu["kernels"][0]["instances"] == 1
    assert any(f"3 rows of {KERNEL} skipped: 3 with" in line for line in warnings_of(err))
    assert any(f"1 row of {RUNTIME} skipped" in line for line in warnings_of(err))


def test_a_device_id_of_100000_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET deviceId = 100000 WHERE start = {2 * MS}",
    )
    result, err = trace_json(capsys, path)
    assert [gpu["device"] for gpu in result["gpus"]] == [0]  # type: ignore[attr-defined]
    (line,) = warnings_of(err)
    assert f"1 row of {KERNEL} skipped: 1 with a deviceId outside 0-65535" in line


@pytest.mark.parametrize("device", ["NULL", "-1"])
def test_null_or_negative_device_ids_are_skipped_not_read_as_a_busy_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    """Once read as a GPU 100 % busy with a compute-bound verdict."""
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET deviceId = {device} WHERE start = {2 * MS}",
        loosen=[KERNEL],
    )
    result, err = trace_json(capsys, path)
    (gpu,) = result["gpus"]  # type: ignore[misc]
    assert gpu["device"] == 0
    assert gpu["verdict"] == "input-bound"
    assert gpu["kernels"][0]["instances"] == 3
    assert gpu["busy_fraction"] == pytest.approx(4 / 9)  # kernels at 0, 4, 6 ms; the copy
    (line,) = warnings_of(err)
    assert f"1 row of {KERNEL} skipped" in line


def test_a_report_whose_every_row_lacks_a_device_has_no_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET deviceId = NULL",
        f"UPDATE {MEMCPY} SET deviceId = -3",
        loosen=[KERNEL],
    )
    result, err = trace_json(capsys, path)
    assert result["gpus"] == []
    assert "holds no CUDA kernels, copies or memsets" in err
    assert any(f"4 rows of {KERNEL} skipped" in line for line in warnings_of(err))


@pytest.mark.parametrize("value", ["NULL", "9e999", "'three'"])
def test_other_columns_with_values_not_integers_are_read_as_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """Columns that may be NULL in real exports (a kernel's process or correlation id, a
    copy's size): a bad value there is unknown, not a skipped row."""
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET correlationId = {value}, globalPid = {value} WHERE start = 0",
        f"UPDATE {MEMCPY} SET bytes = {value}, copyKind = {value}",
        loosen=[MEMCPY],
    )
    result, err = trace_json(capsys, path)
    (gpu,) = result["gpus"]  # type: ignore[misc]
    assert gpu["kernels"][0]["instances"] == 4
    assert gpu["launch_calls"] == 3  # the first kernel's call is no longer found
    assert gpu["memory_ops"][0]["kind"] == "unknown"
    assert gpu["memory_ops"][0]["bytes"] == 0
    assert warnings_of(err) == []


def test_hostile_nvtx_and_capture_times_are_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = ReportBuilder()
    report.add_kernels("gemm", [0, 2 * MS, 4 * MS, 6 * MS], MS)
    report.add_ranges("train_step", [0, 2 * MS, 4 * MS, 6 * MS], 2 * MS)
    path = tamper(
        report.write(tmp_path / "r.sqlite", shuffle=False),
        f"UPDATE {NVTX} SET end = 9e999 WHERE start = {2 * MS}",
        "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 9e999",
    )
    result, _ = trace_json(capsys, path)
    assert result["started_at"] is None
    assert result["iteration"]["nvtx_range"] == "train_step"  # type: ignore[index]
    assert result["iteration"]["count"] == 3  # type: ignore[index]


def test_null_metadata_values_are_not_printed_as_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once "export schema version None (Nsight Systems None)", refused."""
    path = tamper(steps_report(tmp_path / "r.sqlite"), "UPDATE META_DATA_EXPORT SET value = NULL")
    status = main(["trace", "--store-url", "none", str(path)])
    captured = capsys.readouterr()
    assert status == 0
    assert "None" not in captured.out + captured.err
    assert "export schema unknown" in captured.out
    assert "does not say its export schema version" in captured.err


def test_a_span_past_78_hours_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET end = {1 << 60} WHERE start = {2 * MS}",
    )
    status = main(["trace", "--store-url", "none", str(path)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert "spans more than 78 hours" in captured.err


def test_rowids_far_apart_are_read_without_walking_the_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tables are read in rowid ranges: one from each row, not every range up to 2^62."""
    path = tamper(
        steps_report(tmp_path / "r.sqlite"),
        f"UPDATE {KERNEL} SET rowid = {1 << 62} WHERE start = {6 * MS}",
        f"UPDATE {KERNEL} SET rowid = {(1 << 63) - 1} WHERE start = {4 * MS}",
    )
    result, err = trace_json(capsys, path)
    assert result["gpus"][0]["kernels"][0]["instances"] == 4  # type: ignore[index]
    assert warnings_of(err) == []


def test_durations_that_add_up_past_64_bits_are_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calls are not bound by the GPU's span: three of 2^62 ns would overflow their sum."""
    report = ReportBuilder()
    report.add_kernels("gemm", [0, 2 * MS], MS)
    edge = (1 << 61) - 10
    report.add_api_calls("cudaMemGetInfo_v3020", [-edge] * 3, [edge] * 3)
    status = main(["trace", "--store-url", "none", str(report.write(tmp_path / "r.sqlite"))])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err.count("\n") == 1
    assert "add up past 2^62 ns" in captured.err
