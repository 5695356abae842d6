"""``aligned``: the tables of ``analyze``, ``run`` and ``report``, column by column."""

from __future__ import annotations

from datetime import UTC, datetime

from profiler_app.commands.report import table
from profiler_app.profiles.render import aligned, aligned_columns


def test_columns_are_as_wide_as_their_widest_cell_and_numbers_align_right() -> None:
    text = aligned(
        ["NODE", "GPU", "UTIL %"], [["a", "0", "5.00"], ["node-b", "10", "100.00"]], right={1, 2}
    )
    assert text.splitlines() == [
        "NODE    GPU  UTIL %",
        "a         0    5.00",
        "node-b   10  100.00",
    ]


def test_a_column_of_dashes_is_left_out_unless_kept_and_no_line_ends_in_spaces() -> None:
    rows = [["a", "-", "-", "x"], ["b", "-", "-", "-"]]
    assert aligned(["K", "EMPTY", "KEPT", "LAST"], rows, keep={2}).splitlines() == [
        "K  KEPT  LAST",
        "a  -     x",
        "b  -     -",
    ]


def test_no_rows_is_the_header_alone() -> None:
    assert aligned(["NODE", "EMPTY"], []) == "NODE  EMPTY"
    assert aligned_columns(["NODE", "EMPTY"], [(), ()]) == "NODE  EMPTY"


def test_the_reports_cells_keep_their_formats_per_column() -> None:
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    rows = [
        {"trial": "t", "throughput": 1234.5678, "gpu_seconds": 0.0004, "recorded_at": at},
        {"trial": "u", "throughput": None, "gpu_seconds": 12, "recorded_at": None},
        {"trial": "v", "throughput": 7, "gpu_seconds": True, "recorded_at": at},
    ]
    lines = table(rows, "trial", wide=True).splitlines()
    assert lines[0].split() == ["RECORDED", "AT", "TRIAL", "THROUGHPUT", "GPU", "s"]
    assert [line.split() for line in lines[1:]] == [
        ["2026-11-30T08:00:00Z", "t", "1234.57", "0.0004"],
        ["-", "u", "-", "12.00"],
        ["2026-11-30T08:00:00Z", "v", "7", "True"],
    ]


def test_unit_columns_format_numbers_once_per_column_and_leave_other_values_alone() -> None:
    rows = [
        {
            "node": "n",
            "gpu": "0",
            "idle_hours": 1.005,
            "fb_used_max_mib": 80.6,
            "util_max_percent": 7,
        },
        {
            "node": "n",
            "gpu": "1",
            "idle_hours": True,
            "fb_used_max_mib": None,
            "util_max_percent": 0.5,
        },
    ]
    lines = table(rows, "gpu", wide=True).splitlines()
    cells = [line.split() for line in lines[1:]]
    header = lines[0].split()
    assert header[:2] == ["NODE", "GPU"]
    assert header[-7:] == ["UTIL", "MAX", "%", "FB", "USED", "MAX", "MiB"]
    # idle hours: .2f; percent: .2f even for an int; MiB: no decimals; a bool and None as _cell.
    assert cells == [["n", "0", "1.00", "7.00", "81"], ["n", "1", "True", "0.50", "-"]]
