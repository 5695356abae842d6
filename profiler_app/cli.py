"""The ``gpu-profiler`` command line: parses arguments and hands off to one command module."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from profiler_app import __version__
from profiler_app.commands import analyze, report, run
from profiler_app.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-profiler",
        description="Classify what each GPU is doing (idle, training, inference, bursty) "
        "and publish it to Kubernetes annotations, Prometheus metrics and a table store.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (run, analyze, report):
        command.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        status: int = args.handler(args)
    except UserError as error:
        print(f"gpu-profiler: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    return status
