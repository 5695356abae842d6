"""``gpu-profiler report``: what the GPUs did over a time range, from the table store."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

from profiler_app.commands import SUMMARIES, options, progress
from profiler_app.core.durations import format_duration, parse_duration
from profiler_app.core.errors import UserError
from profiler_app.reports.rightsizing.defaults import DEFAULT_HEADROOM, RIGHTSIZE_METRIC
from profiler_app.reports.views import DEFAULT_IDLE_BELOW_PERCENT, REPORT_VIEWS
from profiler_app.sinks.store.urls import StoreUrl, parse_store_url

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from profiler_app.reports.rightsizing import Advice

# The table and the advice's rows (render, rightsizing) load where used: `report --help` and
# a bad argument need neither.

# ``--output json`` of report: the envelope's keys and each view's row keys are a contract
# (docs/cli.md). Keys may be added within a version; removing, renaming or retyping one raises it.
REPORT_FORMAT_VERSION = 1
RIGHTSIZE_VIEW = "rightsize"
DEFAULT_TOP = 10
# Advice only: a measured trial confirms it (docs/trial.md; it does not place MIG slices yet).
TRIAL_HINT = (
    "gpu-profiler: advice only, nothing is applied; confirm it with a measured trial: "
    "gpu-profiler trial plan (docs/trial.md)"
)
# What a narrow table shows of each view (``-o wide`` shows every column); a view not named here
# shows all of its columns.
NARROW_COLUMNS = {
    "node": {
        "node",
        "gpus",
        "covered_hours",
        "training_hours",
        "inference_hours",
        "bursty_hours",
        "idle_hours",
        "idle_gpu_hours",
        "util_max_percent",
    },
    "gpu": {
        "node",
        "gpu",
        "training_hours",
        "inference_hours",
        "bursty_hours",
        "idle_hours",
        "idle_gpu_hours",
        "util_max_percent",
    },
    "pod": {
        "namespace",
        "pod",
        "node",
        "gpus",
        "gpu_hours",
        "gpu_util_max_percent",
        "fb_used_max_mib",
        # The input a training loop may wait on (docs/analysis.md, "Input-bound hint").
        "disk_read_max_bytes_per_second",
        "network_receive_max_bytes_per_second",
        "owner_kind",
        "owner_name",
    },
    "trace": {
        "namespace",
        "pod",
        "started_at",
        "device",
        "verdict",
        "busy_fraction",
        "iteration_seconds",
        "profiler_period_seconds",
    },
}
NARROW_COLUMNS["idle-pods"] = NARROW_COLUMNS["pod"]
# Columns a table always shows, even when empty: what each row is.
_KEYS = {"node", "gpu", "namespace", "pod", "kind", "device", "started_at"}
# Units named by a column's suffix: (suffix, unit in the header, factor from the stored value).
_UNITS = (
    ("_bytes_per_second", "MiB/s", 1.0 / 2**20),
    ("_percent", "%", 1.0),
    ("_fraction", "%", 100.0),
    ("_hours", "h", 1.0),
    ("_seconds", "s", 1.0),
    ("_mib", "MiB", 1.0),
    ("_bytes", "MiB", 1.0 / 2**20),
)
_VIEW_TITLES = {
    "node": "Nodes",
    "gpu": "GPUs",
    "pod": "Pods holding GPUs",
    "idle-pods": "Pods holding GPUs they do not use",
    "waste": "Idle GPU-hours by who can act on them",
    "trace": "Nsight Systems traces (gpu-profiler trace)",
    "trial": "Trials of placements (gpu-profiler trial run)",
}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "report",
        help=SUMMARIES["report"],
        description="Summaries from the table store for a time range: per node, per GPU, per "
        "pod, the pods that hold GPUs without using them, or the Nsight Systems traces "
        "recorded by gpu-profiler trace (by capture start).",
    )
    options.add_store_url_option(parser, purpose="the table store to read", none=None)
    parser.add_argument(
        "--by",
        choices=(*REPORT_VIEWS, RIGHTSIZE_VIEW),
        default="gpu",
        help="which summary to print; rightsize: right-sizing advice per workload "
        "(docs/sharing.md) (default: %(default)s)",
    )
    parser.add_argument(
        "--since", default="24h", help="how far back from --until, e.g. 6h, 7d (default: 24h)"
    )
    parser.add_argument(
        "--until",
        help="end of the range, an ISO 8601 time such as 2026-01-31T00:00Z (default: now)",
    )
    parser.add_argument("--node", help="only this node (default: all nodes)")
    parser.add_argument(
        "--top",
        type=int,
        help="most rows listed by --by pod, idle-pods and rightsize (most GPU-hours first) and "
        f"by waste (per kind, most idle GPU-hours first); 0 = all (default: {DEFAULT_TOP}; "
        "all for -o prometheus)",
    )
    parser.add_argument(
        "--idle-below",
        type=float,
        default=DEFAULT_IDLE_BELOW_PERCENT,
        metavar="PERCENT",
        help="a pod is idle when its peak GPU utilisation stayed at or below this "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--headroom",
        type=float,
        default=DEFAULT_HEADROOM,
        metavar="FRACTION",
        help="--by rightsize: memory headroom over the peak framebuffer (default: %(default)s)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json", "csv", "prometheus"),
        default="table",
        help="table (the main columns), wide (every column), json (one object, keys in "
        "docs/store.md), csv, or prometheus (--by rightsize only: the metric "
        f"{RIGHTSIZE_METRIC} in the text exposition format) (default: %(default)s)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.store_url.strip().lower() == "none":
        raise UserError("the report reads the table store: give --store-url")
    if args.top is None:  # a metric's consumers expect every workload
        args.top = 0 if args.output == "prometheus" else DEFAULT_TOP
    if args.top < 0:
        raise UserError(f"--top {args.top}: give 0 (all) or more")
    if args.output == "prometheus" and args.by != RIGHTSIZE_VIEW:
        raise UserError("--output prometheus is for --by rightsize")
    if not 0 <= args.headroom <= MAX_HEADROOM:
        raise UserError(
            f"--headroom {args.headroom:g}: a fraction of the peak from 0 to "
            f"{MAX_HEADROOM:g}, e.g. 0.15 for 15 %"
        )
    if not 0 <= args.idle_below <= 100:
        raise UserError(f"--idle-below {args.idle_below:g}: a percentage from 0 to 100")
    until = _parse_time(args.until) if args.until else datetime.now(UTC)
    since = _start(until, args.since)
    url = options.checked(args.store_url, parse_store_url)
    if args.by == RIGHTSIZE_VIEW:
        return _rightsize(args, url, since, until)
    # The store layer (SQLAlchemy) is loaded once the arguments are good.
    from profiler_app.reports.history import build_report, report_rows  # noqa: PLC0415

    with _connected(url) as connection:
        report = build_report(
            connection,
            since=since,
            until=until,
            node=args.node,
            top=args.top or None,
            idle_below_percent=args.idle_below,
            views=(args.by,),
        )
    for note in report.notes:
        print(f"gpu-profiler: note: {note}", file=sys.stderr)
    rows = report_rows(report, args.by)
    if not rows:
        where = f" on node {args.node}" if args.node else ""
        print(
            f"gpu-profiler: no {args.by} data in the store between {_iso(since)} and "
            f"{_iso(until)}{where}",
            file=sys.stderr,
        )
    write_rows(rows, args.by, args.output, sys.stdout, since=since, until=until, node=args.node)
    return 0


@contextmanager
def _connected(url: StoreUrl) -> Iterator[Connection]:
    """A connection to the store at the schema this version reads; a driver's error as one
    line naming the store."""
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415

    from profiler_app.sinks.store.engine import (  # noqa: PLC0415
        create_store_engine,
        current_revisions,
        describe_error,
    )

    engine = create_store_engine(url, create_file=False)
    try:
        with progress.spinner(f"reading {url.display()}"), engine.connect() as connection:
            _check_schema(current_revisions(connection), url.display())
            yield connection
    except SQLAlchemyError as error:
        raise UserError(f"cannot read the store {url.display()}: {describe_error(error)}") from None
    finally:
        engine.dispose()


def _rightsize(args: argparse.Namespace, url: StoreUrl, since: datetime, until: datetime) -> int:
    from profiler_app.reports.rightsize import rightsize_advice  # noqa: PLC0415

    notes: list[str] = []
    with _connected(url) as connection:
        advices = rightsize_advice(
            connection,
            since=since,
            until=until,
            node=args.node,
            headroom=args.headroom,
            top=args.top or None,
            notes=notes,
        )
    for note in notes:
        print(f"gpu-profiler: note: {note}", file=sys.stderr)
    if not advices:
        where = f" on node {args.node}" if args.node else ""
        print(
            f"gpu-profiler: no workload on a GPU in the store between {_iso(since)} and "
            f"{_iso(until)}{where}",
            file=sys.stderr,
        )
    write_advice(advices, args.output, sys.stdout, since=since, until=until, node=args.node)
    if args.output in ("table", "wide") and any(advice.label for advice in advices):
        print(TRIAL_HINT, file=sys.stderr)
    return 0


def write_advice(
    advices: list[Advice],
    output: str,
    out: TextIO,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
) -> None:
    """Right-sizing advice in one of ``report``'s outputs, or as the Prometheus metric."""
    from profiler_app.profiles.render import aligned  # noqa: PLC0415
    from profiler_app.reports.rightsizing.output import (  # noqa: PLC0415
        COLUMNS,
        RIGHTSIZE_HELP,
        RIGHTSIZE_LABELS,
        advice_record,
        csv_text,
        metric_samples,
        table_rows,
    )

    if output == "json":
        records = [advice_record(advice) for advice in advices]
        document = _report_document(RIGHTSIZE_VIEW, records, since, until, node)
        out.write(json_text(document, allow_nan=False))
    elif output == "csv":
        out.write(csv_text(advices))
    elif output == "prometheus":
        out.write(f"# HELP {RIGHTSIZE_METRIC} {RIGHTSIZE_HELP}\n# TYPE {RIGHTSIZE_METRIC} gauge\n")
        for labels, value in metric_samples(advices):
            text = ",".join(f'{name}="{_escaped(labels[name])}"' for name in RIGHTSIZE_LABELS)
            out.write(f"{RIGHTSIZE_METRIC}{{{text}}} {value:g}\n")
    elif advices:
        title = f"Right-sizing advice, {format_duration((until - since).total_seconds())} up to"
        rows = [list(row) for row in table_rows(advices)]
        out.write(f"{title} {_iso(until)}\n{aligned(list(COLUMNS), rows, keep={0, 1, 3})}\n")


def _report_document(
    view: str, records: list[dict[str, Any]], since: datetime, until: datetime, node: str | None
) -> dict[str, Any]:
    """The JSON envelope of every view's rows."""
    return {
        "kind": "report",
        "format_version": REPORT_FORMAT_VERSION,
        "view": view,
        "since": _iso(since),
        "until": _iso(until),
        "node": node,
        "rows": records,
    }


def json_text(document: dict[str, Any], *, allow_nan: bool = True) -> str:
    """The report's JSON as one string, written at once: the envelope indented, its ``rows``
    last, one compact object per line (indenting every row costs 3 times the encoding)."""
    rows = document["rows"]
    head = json.dumps({**document, "rows": []}, indent=2, allow_nan=allow_nan)
    if not rows:
        return f"{head}\n"
    assert head.endswith("[]\n}")
    body = ",\n".join(f"    {json.dumps(row, allow_nan=allow_nan)}" for row in rows)
    return f"{head[:-4]}[\n{body}\n  ]\n}}\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_rows(
    rows: list[dict[str, Any]],
    by: str,
    output: str,
    out: TextIO,
    *,
    since: datetime,
    until: datetime,
    node: str | None = None,
) -> None:
    if output == "json":
        records = [{k: _plain(v) for k, v in row.items()} for row in rows]
        document = _report_document(by, records, since, until, node)
        out.write(json_text(document))
    elif output == "csv":
        buffer = io.StringIO()  # written at once: a write per cell is slower than the table
        columns = _view_columns(by)
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([_plain(row.get(column)) for column in columns] for row in rows)
        out.write(buffer.getvalue())
    elif rows:
        out.write(f"{_title(by, since, until)}\n{table(rows, by, wide=output == 'wide')}\n")


def table(rows: list[dict[str, Any]], by: str, *, wide: bool = False) -> str:
    """A view's rows as aligned columns, units in the headers, nothing cut. The narrow default
    shows the columns in ``NARROW_COLUMNS`` (all of a view it does not name); ``wide`` all."""
    from profiler_app.profiles.render import aligned_columns  # noqa: PLC0415

    columns = _view_columns(by)
    if not wide and by in NARROW_COLUMNS:
        columns = [column for column in columns if column in NARROW_COLUMNS[by]]
    units = [_unit(column) for column in columns]
    return aligned_columns(
        [
            _TABLE_HEADERS.get((by, column)) or _header(column, unit)
            for column, unit in zip(columns, units, strict=True)
        ],
        [
            _cells([row.get(column) for row in rows], unit)
            for column, unit in zip(columns, units, strict=True)
        ],
        right={index for index, column in enumerate(columns) if not _is_text(rows, column)},
        keep={index for index, column in enumerate(columns) if column in _KEYS},
    )


# Headers that would read alike across views while meaning different things: a pod's `gpus`
# lists the GPUs it held (indices), a node's counts them.
_TABLE_HEADERS = {("pod", "gpus"): "GPU INDICES", ("idle-pods", "gpus"): "GPU INDICES"}


def _view_columns(by: str) -> list[str]:
    from profiler_app.reports.history import view_columns  # noqa: PLC0415  (loaded by then)

    return view_columns(by)


def _unit(column: str) -> tuple[str, str, float] | None:
    """(suffix, unit shown, factor) of a column whose name ends in a unit."""
    return next((unit for unit in _UNITS if column.endswith(unit[0])), None)


def _header(column: str, unit: tuple[str, str, float] | None) -> str:
    """``util_max_percent`` -> ``UTIL MAX %``, ``idle_gpu_hours`` -> ``IDLE GPU h``."""
    stem = column.removesuffix(unit[0]) if unit else column
    name = stem.replace("_", " ").upper()
    return f"{name} {unit[1]}" if unit else name


def _check_schema(current: tuple[str, ...], url: str) -> None:
    from profiler_app.sinks.store.engine import head_revisions  # noqa: PLC0415

    if not current:
        raise UserError(f"{url} has no gpu-profiler tables (is it the daemon's --store-url?)")
    if set(current) != set(head_revisions()):
        raise UserError(
            f"{url} has schema revision {', '.join(current)} but this gpu-profiler reads "
            f"{', '.join(head_revisions())}: run the matching gpu-profiler version"
        )


# Three times the peak is already more than any GPU's memory step; 5 was meant as 5 %.
MAX_HEADROOM = 2.0
_BARE_NUMBER = re.compile(r"\d+(\.\d*)?|\.\d+")


def _start(until: datetime, since: str) -> datetime:
    """``until`` minus the ``--since`` duration, or one error line when that is before year 1."""
    if _BARE_NUMBER.fullmatch(since.strip()):  # 5 seconds is never what a report means
        raise UserError(f"--since {since}: give a unit, e.g. {since.strip()}h or {since.strip()}d")
    try:
        seconds = parse_duration(since)
    except UserError as error:
        raise UserError(f"--since: {error}") from None
    try:
        return until - timedelta(seconds=seconds)
    except OverflowError:
        raise UserError(f"--since {since} reaches back before the year 1") from None


def _parse_time(text: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(
            f"malformed --until {text!r}: use ISO 8601, e.g. 2026-01-31T00:00Z"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _title(by: str, since: datetime, until: datetime) -> str:
    span = format_duration((until - since).total_seconds())
    return f"{_VIEW_TITLES[by]}, {span} up to {_iso(until)}"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    return _iso(value) if isinstance(value, datetime) else value


def _is_text(rows: list[dict[str, Any]], column: str) -> bool:
    return any(isinstance(row.get(column), str | datetime) for row in rows)


def _scaled(value: float, unit: str) -> str:
    if unit == "MiB":
        return f"{value:.0f}"
    if unit == "s" and 0 < abs(value) < 1:  # a 25 ms iteration is 0.025 s, not 0.03
        return f"{value:.3g}"
    return f"{value:.2f}"


def _cells(values: list[Any], unit: tuple[str, str, float] | None) -> list[str]:
    """A column's cells, each as ``_cell`` writes it, with the number format chosen once for
    the column (the gpu view's 8,500 rows: 18 ms rather than 34)."""
    if unit is None or unit[1] == "s":
        return [_cell(value, unit) for value in values]
    spec, factor = (".0f" if unit[1] == "MiB" else ".2f"), unit[2]
    return [
        format(value * factor, spec)
        if type(value) is float or type(value) is int
        else _cell(value, unit)
        for value in values
    ]


def _cell(value: Any, unit: tuple[str, str, float] | None = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, float | int) and not isinstance(value, bool) and unit is not None:
        return _scaled(value * unit[2], unit[1])
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
