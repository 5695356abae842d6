"""``gpu-profiler trial clean``: delete what one run created, or every run past an age or past
the end its anchor states, and say what is kept and when the next run collects it."""

from __future__ import annotations

import argparse
import sys
import time

from profiler_app.commands.trial.common import api_errors, connect, duration
from profiler_app.core.durations import format_duration
from profiler_app.core.errors import UserError
from profiler_app.trial.collect import collect_runs, delete_run, found_runs, remaining_objects


def handle(args: argparse.Namespace) -> int:
    cluster = connect(args.kubeconfig)
    now = time.time()
    try:
        if args.run:
            delete_run(cluster, args.namespace, args.run)
            left = remaining_objects(cluster, args.namespace, args.run)
            print(
                f"gpu-profiler: run {args.run}: deleted"
                + (f"; still going: {', '.join(left)}" if left else ""),
                file=sys.stderr,
            )
            return 0
        older = None if args.expired else duration(args.older_than, "--older-than")
        found = found_runs(cluster, args.namespace)
        runs = collect_runs(cluster, args.namespace, now, older_than=older)
    except api_errors() as error:
        raise UserError(f"trial clean: {error}") from None
    which = "past their end" if args.expired else f"older than {args.older_than}"
    print(
        f"gpu-profiler: removed {len(runs)} run(s) {which}"
        + (f": {', '.join(runs)}" if runs else ""),
        file=sys.stderr,
    )
    for run, created, expires in found:  # what is left, and when the next run collects it
        if run in runs:
            continue
        started = (
            "start unknown" if created is None else f"started {format_duration(now - created)} ago"
        )
        ends = (
            "no stated end"
            if expires is None
            else f"collected by the next run in {format_duration(max(0.0, expires - now))}"
        )
        print(f"gpu-profiler: kept run {run}: {started}; {ends}", file=sys.stderr)
    return 0
