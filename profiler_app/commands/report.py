"""``gpu-profiler report``: what the GPUs did over a time range, from the table store."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from profiler_app.durations import format_duration, parse_duration
from profiler_app.errors import UserError
from profiler_app.reporting import (
    DEFAULT_IDLE_BELOW_PERCENT,
    REPORT_VIEWS,
    build_report,
    report_rows,
    view_columns,
)
from profiler_app.sinks.store.engine import (
    create_store_engine,
    current_revisions,
    describe_error,
    head_revisions,
)
from profiler_app.sinks.store.urls import default_store_url, parse_store_url
from profiler_app.urls import without_credentials

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
        help="summarise the table store: hours per job type, idle GPU-hours, idle pods, traces, "
        "trials",
        description="Summaries from the table store for a time range: per node, per GPU, per "
        "pod, the pods that hold GPUs without using them, or the Nsight Systems traces "
        "recorded by gpu-profiler trace (by capture start).",
    )
    store_url = os.environ.get("GPU_PROFILER_STORE_URL") or default_store_url()
    parser.add_argument(
        "--store-url",
        metavar="URL",
        default=store_url,
        # The environment's URL may hold a password: --help shows it masked.
        help="sqlite:///PATH or postgresql://USER@HOST/DB (env GPU_PROFILER_STORE_URL; "
        f"default: {without_credentials(store_url).replace('%', '%%')})",
    )
    parser.add_argument(
        "--by",
        choices=REPORT_VIEWS,
        default="gpu",
        help="which summary to print (default: %(default)s)",
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
        default=10,
        help="most pods listed by --by pod and idle-pods, most GPU-hours first; 0 = all "
        "(default: %(default)s)",
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
        "--output",
        choices=("table", "json", "csv"),
        default="table",
        help="output format (default: %(default)s)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    if args.store_url.strip().lower() == "none":
        raise UserError("the report reads the table store: give --store-url")
    if args.top < 0:
        raise UserError("--top must be 0 (all) or more")
    until = _parse_time(args.until) if args.until else datetime.now(UTC)
    since = _start(until, args.since)
    url = parse_store_url(args.store_url)
    engine = create_store_engine(url, create_file=False)
    try:
        with engine.connect() as connection:
            _check_schema(current_revisions(connection), url.display())
            report = build_report(
                connection,
                since=since,
                until=until,
                node=args.node,
                top=args.top or None,
                idle_below_percent=args.idle_below,
            )
    except SQLAlchemyError as error:
        raise UserError(f"cannot read the store {url.display()}: {describe_error(error)}") from None
    finally:
        engine.dispose()
    rows = report_rows(report, args.by)
    if not rows:
        where = f" on node {args.node}" if args.node else ""
        print(
            f"gpu-profiler: no {args.by} data in the store between {_iso(since)} and "
            f"{_iso(until)}{where}",
            file=sys.stderr,
        )
    write_rows(rows, args.by, args.output, sys.stdout, title=_title(args.by, since, until))
    return 0


def write_rows(rows: list[dict[str, Any]], by: str, output: str, out: TextIO, title: str) -> None:
    if output == "json":
        json.dump([{k: _plain(v) for k, v in row.items()} for row in rows], out, indent=2)
        out.write("\n")
    elif output == "csv":
        writer = csv.DictWriter(out, fieldnames=view_columns(by), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _plain(v) for k, v in row.items()} for row in rows)
    elif rows:
        table = Table(title=title)
        for column in view_columns(by):
            table.add_column(
                column.replace("_", " "), justify="left" if _is_text(rows, column) else "right"
            )
        for row in rows:
            table.add_row(*(_cell(value) for value in row.values()))
        Console(file=out, width=200 if not out.isatty() else None).print(table)


def _check_schema(current: tuple[str, ...], url: str) -> None:
    if not current:
        raise UserError(f"{url} has no gpu-profiler tables (is it the daemon's --store-url?)")
    if set(current) != set(head_revisions()):
        raise UserError(
            f"{url} has schema revision {', '.join(current)} but this gpu-profiler reads "
            f"{', '.join(head_revisions())}: run the matching gpu-profiler version"
        )


def _start(until: datetime, since: str) -> datetime:
    """``until`` minus the ``--since`` duration, or one error line when that is before year 1."""
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
    return any(isinstance(row[column], str | datetime) for row in rows)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)
