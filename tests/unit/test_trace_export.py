"""``gpu-profiler trace`` on files that are not a readable Nsight Systems export.

Reports are built by ``tests.support.nsys.builder.ReportBuilder`` (a test double: no GPU or nsys
here) with the documented export schema; a ``.nsys-rep`` is exported by a stand-in ``nsys``
script on PATH (a test double that records its arguments and writes such an export).
"""

from __future__ import annotations

import json
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

from profiler_app.cli import main
from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.schema import KERNEL

MS = 1_000_000


def small_report(path: Path, **builder: object) -> Path:
    report = ReportBuilder(**builder)  # type: ignore[arg-type]
    report.add_kernels("gemm", [0, 2 * MS, 4 * MS], MS)
    return report.write(path)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["trace", "--store-url", "none", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_error_line(status: int, out: str, err: str, message: str) -> None:
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("gpu-profiler: error: ")
    assert message in err
    assert "Traceback" not in err


def truncated(tmp_path: Path) -> Path:
    whole = small_report(tmp_path / "whole.sqlite")
    data = whole.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 2])
    return cut


def damaged(tmp_path: Path) -> Path:
    """Right size, but the pages after the first are zeros (a copy that failed midway)."""
    whole = small_report(tmp_path / "whole.sqlite")
    data = bytearray(whole.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    data[page_size:] = bytes(len(data) - page_size)
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(bytes(data))
    return broken


def plain_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, value TEXT)")
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp, "is a directory"),
        (lambda tmp: tmp / "absent.sqlite", "no report at"),
        (lambda tmp: _write(tmp / "notes.txt", b"not a database at all\n" * 20), "not an SQLite"),
        (lambda tmp: _write(tmp / "empty.sqlite", b""), "not an SQLite"),
        (lambda tmp: _write(tmp / "stub.sqlite", b"SQLite format 3\x00" + b"\0" * 20), "truncated"),
        (truncated, "truncated"),
        (damaged, "damaged or truncated"),
        (plain_sqlite, "not an Nsight Systems export"),
        (lambda tmp: Path("~no-such-user-here/report.sqlite"), "cannot expand"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    status, out, err = run(capsys, str(path))
    assert_one_error_line(status, out, err, message)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_an_unknown_schema_version_is_refused_saying_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_report(tmp_path / "future.sqlite", schema_version="4.0.0")
    status, out, err = run(capsys, str(path))
    assert_one_error_line(status, out, err, "export schema version 4.0.0")
    assert "reads schema 2.x and 3.x" in err


def test_a_missing_schema_version_is_a_warning_and_the_report_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_report(tmp_path / "old.sqlite", schema_version=None)
    status, out, err = run(capsys, str(path), "--output", "json")
    assert status == 0
    assert "gpu-profiler: warning:" in err
    assert "does not say its export schema version" in err
    result = json.loads(out)
    assert result["schema_version"] is None
    assert any("EXPORT_SCHEMA_VERSION" in warning for warning in result["warnings"])
    assert result["gpus"][0]["kernels"][0]["instances"] == 3


def test_a_table_without_a_column_it_needs_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = small_report(tmp_path / "odd.sqlite")
    with sqlite3.connect(path) as connection:
        connection.execute(f"ALTER TABLE {KERNEL} DROP COLUMN correlationId")
    status, out, err = run(capsys, str(path))
    assert_one_error_line(status, out, err, "has no column correlationId")


def test_a_bad_pod_or_top_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = small_report(tmp_path / "ok.sqlite")
    assert_one_error_line(*run(capsys, str(path), "--pod", "no-namespace"), "NAMESPACE/NAME")
    assert_one_error_line(*run(capsys, str(path), "--top", "0"), "--top")
    status, out, err = run(capsys, str(path), "--iteration-range", "step")
    assert_one_error_line(status, out, err, "no NVTX range 'step'")


def test_a_malformed_store_url_fails_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["trace", str(tmp_path / "absent.sqlite"), "--store-url", "ftp://x/y"])
    out, err = capsys.readouterr()
    assert_one_error_line(status, out, err, "unsupported store URL scheme")


def test_nsys_rep_without_nsys_says_how_to_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    report = _write(tmp_path / "run1.nsys-rep", b"\x00binary nsys report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    status, out, err = run(capsys, str(report))
    assert_one_error_line(status, out, err, "nsys is not on PATH")
    assert "nsys export --type sqlite --output run1.sqlite run1.nsys-rep" in err


STAND_IN_NSYS = """#!{python}
# Stand-in nsys (test double): records its arguments, writes the prepared export to --output.
import shutil, sys
args = sys.argv[1:]
open({log!r}, "w").write(" ".join(args))
if {fail!r}:
    print("Error: the report is corrupted", file=sys.stderr)
    sys.exit(1)
shutil.copy({export!r}, args[args.index("--output") + 1])
"""


def stand_in_nsys(tmp_path: Path, export: Path, *, fail: bool = False) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nsys"
    script.write_text(
        STAND_IN_NSYS.format(
            python=sys.executable,
            log=str(tmp_path / "nsys-args"),
            fail=fail,
            export=str(export),
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_nsys_rep_is_exported_with_nsys_when_it_is_on_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    export = small_report(tmp_path / "prepared.sqlite")
    report = _write(tmp_path / "run1.nsys-rep", b"\x00binary nsys report")
    monkeypatch.setenv("PATH", str(stand_in_nsys(tmp_path, export)))
    status, out, err = run(capsys, str(report), "--output", "json")
    assert (status, err) == (0, "")
    assert json.loads(out)["gpus"][0]["kernels"][0]["name"] == "gemm"
    arguments = (tmp_path / "nsys-args").read_text().split()
    assert arguments[:5] == ["export", "--type", "sqlite", "--force-overwrite", "true"]
    assert arguments[-1] == str(report)
    assert not report.with_suffix(".sqlite").exists()  # exported into a scratch directory


def test_a_failing_nsys_export_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    export = small_report(tmp_path / "prepared.sqlite")
    report = _write(tmp_path / "run1.nsys-rep", b"\x00")
    monkeypatch.setenv("PATH", str(stand_in_nsys(tmp_path, export, fail=True)))
    status, out, err = run(capsys, str(report))
    assert_one_error_line(status, out, err, "the report is corrupted")
