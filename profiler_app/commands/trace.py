"""``gpu-profiler trace``: where one job's time went, from an Nsight Systems report.

Reads a ``.sqlite`` export (or a ``.nsys-rep``, exported first when nsys is installed), prints
per GPU the busy fraction, idle gaps, top kernels and their families, memory operations, CUDA
API time, the iteration period and a verdict with its evidence, and records one row per GPU in
the table store (``--store-url none`` to skip). docs/trace.md has the rules and the JSON keys.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from profiler_app.commands import SUMMARIES, options
from profiler_app.core.errors import UserError

if TYPE_CHECKING:
    from profiler_app.trace.summary import TraceSummary

# numpy, SQLAlchemy and the trace readers load in handle(): `trace --help` needs none of them.


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "trace",
        help=SUMMARIES["trace"],
        description="Summarise an Nsight Systems SQLite export (nsys export --type sqlite) per "
        "GPU, say what its kernels are made of (GEMM, attention, NCCL, ...) and name what limits "
        "the job: input-, launch-, transfer-, sync-, compute- or communication-bound.",
    )
    parser.add_argument("report", metavar="REPORT", help="REPORT.sqlite (or REPORT.nsys-rep)")
    parser.add_argument(
        "--pod",
        metavar="NAMESPACE/NAME",
        help="the pod the report was recorded in: keys the stored rows and finds the "
        "continuous profiler's period for it",
    )
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME") or None,
        metavar="NAME",
        help="the node the pod ran on (env NODE_NAME; default: unset)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help="table (default) or json: one object, keys in docs/trace.md",
    )
    options.add_store_url_option(
        parser, purpose="table store to record the result in", none="to record nothing"
    )
    parser.add_argument(
        "--iteration-range",
        metavar="NAME",
        help="the NVTX range that marks one iteration (default: found from the ranges)",
    )
    parser.add_argument(
        "--kernel-families",
        metavar="FILE",
        default=os.environ.get("GPU_PROFILER_KERNEL_FAMILIES") or None,
        help="a TOML file of kernel families, tried before the built-in ones (env "
        "GPU_PROFILER_KERNEL_FAMILIES; format in docs/trace.md)",
    )
    parser.add_argument(
        "--top",
        type=int,
        default=10,
        metavar="N",
        help="kernels listed per GPU (default: %(default)s)",
    )
    parser.set_defaults(handler=handle)


def _pod(text: str | None) -> tuple[str | None, str | None]:
    if text is None:
        return None, None
    namespace, _, name = text.strip().partition("/")
    if not namespace or not name or "/" in name:
        raise UserError(f"--pod takes NAMESPACE/NAME, got {text!r}")
    return namespace, name


def handle(args: argparse.Namespace) -> int:
    from profiler_app.sinks.store.urls import parse_store_url  # noqa: PLC0415
    from profiler_app.trace import families  # noqa: PLC0415
    from profiler_app.trace.export import open_report  # noqa: PLC0415
    from profiler_app.trace.render import render  # noqa: PLC0415
    from profiler_app.trace.summary import summarise, to_json  # noqa: PLC0415

    namespace, pod = _pod(args.pod)
    if args.top < 1:
        raise UserError("--top must be 1 or more")
    store_url = None if args.store_url.strip().lower() == "none" else args.store_url.strip()
    if store_url is not None:
        # a malformed URL fails before the report is read
        options.checked(args.store_url, lambda _: parse_store_url(store_url))
    classifier = families.load_extra(args.kernel_families) if args.kernel_families else None
    with open_report(args.report) as export:
        summary = summarise(
            export,
            iteration_range=args.iteration_range,
            classifier=classifier or families.DEFAULT,
        )
    if store_url is not None:
        _record(summary, store_url, namespace, pod, args.node)
    for warning in summary.warnings:
        print(f"gpu-profiler: warning: {warning}", file=sys.stderr)
    if not summary.gpus:
        print(
            f"gpu-profiler: {summary.report} holds no CUDA kernels, copies or memsets: was it "
            "recorded with nsys profile --trace=cuda?",
            file=sys.stderr,
        )
    # A reader that leaves early (| head) ends the command quietly: cli.main sees to it.
    if args.output == "json":
        json.dump(to_json(summary, top=args.top), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        render(summary, sys.stdout, top=args.top)
    return 0


def _record(
    summary: TraceSummary, url: str, namespace: str | None, pod: str | None, node: str | None
) -> None:
    # Imported here: SQLAlchemy takes a quarter of a second to import, for nothing with
    # --store-url none.
    from profiler_app.sinks.store.traces import TraceStore, trace_rows  # noqa: PLC0415

    store = TraceStore(url)
    try:
        if namespace is not None and pod is not None:
            summary.profiler_period_seconds = store.profiler_period(namespace, pod)
        started_at = summary.started_at
        if started_at is None:
            started_at = datetime.fromtimestamp(Path(summary.report).stat().st_mtime, UTC)
            summary.warnings.append(
                "the report has no capture start time (TARGET_INFO_SESSION_START_TIME); "
                f"stored under the file's modification time {started_at.isoformat()}"
            )
        rows = trace_rows(summary, namespace=namespace, pod=pod, node=node, started_at=started_at)
        store.record(rows)
    finally:
        store.close()
