"""The ``gpu-profiler`` command line: parses arguments and hands off to one command module."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from profiler_app import __version__
from profiler_app.errors import UserError

# Imported only when used: the store's and the daemon's dependencies take about a second to load.
COMMAND_MODULES = {
    "run": "profiler_app.commands.run",
    "analyze": "profiler_app.commands.analyze",
    "report": "profiler_app.commands.report",
    "trace": "profiler_app.commands.trace",
    "unprotect": "profiler_app.commands.unprotect",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with just ``only`` when the command line names it."""
    parser = argparse.ArgumentParser(
        prog="gpu-profiler",
        description="Classify what each GPU is doing (idle, training, inference, bursty) "
        "and publish it to Kubernetes annotations, Prometheus metrics and a table store; "
        "explain one job from an Nsight Systems report (trace).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMAND_MODULES.items():
        if only in (None, name):
            importlib.import_module(module).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    first = arguments[0] if arguments else None
    if first in COMMAND_MODULES or first == "--version":
        parser = build_parser(only=first)  # "--version" loads no command at all
    else:
        parser = build_parser()
    args = parser.parse_args(arguments)
    logging.basicConfig(
        level=getattr(args, "log_level", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for chatty in ("alembic", "kubernetes", "urllib3"):  # their INFO lines say nothing to users
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        status: int = args.handler(args)
    except UserError as error:
        print(f"gpu-profiler: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    return status
