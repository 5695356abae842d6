"""The ``gpu-profiler`` command line: parses arguments and hands off to one command module."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from profiler_app import __version__
from profiler_app.commands import SUMMARIES
from profiler_app.core.errors import UserError

# Imported only when used: the store's and the daemon's dependencies take about a second to load.
COMMAND_MODULES = {
    "run": "profiler_app.commands.run",
    "analyze": "profiler_app.commands.analyze",
    "report": "profiler_app.commands.report",
    "trace": "profiler_app.commands.trace",
    "trial": "profiler_app.commands.trial",
    "completion": "profiler_app.commands.completion",
    "unprotect": "profiler_app.commands.unprotect",
    "demo": "profiler_app.commands.demo",
}


class CommandLineParser(argparse.ArgumentParser):
    """argparse with one-line usage errors that point to ``--help`` instead of repeating the
    usage, and values such as ``-5m`` read as values (then refused by their own check with a
    clear line) rather than as unknown flags."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _parse_optional(self, arg_string: str) -> Any:
        if _NEGATIVE_VALUE.match(arg_string):
            return None
        return super()._parse_optional(arg_string)


# A leading minus then a number (or inf, nan) is a (negative) value: no option of ours is named so.
_NEGATIVE_VALUE = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


def build_parser(only: str | None = None, *, summary: bool = False) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with just ``only`` when the command line names it;
    ``summary``: each subcommand by name and help line only, no command module imported (the
    top-level ``--help``, an unknown command)."""
    parser = CommandLineParser(
        prog="gpu-profiler",
        description="Classify what each GPU is doing (idle, training, inference, bursty) "
        "and publish it to Kubernetes annotations, Prometheus metrics and a table store; "
        "explain one job from an Nsight Systems report (trace); try a training job on other "
        "placements (trial).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(full_parser=build_parser)  # for `completion`, which completes them all
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMAND_MODULES.items():
        if summary:
            commands.add_parser(name, help=SUMMARIES[name], add_help=False)
        elif only in (None, name):
            importlib.import_module(module).register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command. A reader that closes the pipe early (``| head``) ends it quietly, exit 0,
    as it ends ``git log`` or ``kubectl get``: the output was wanted only in part."""
    try:
        status = _run(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit:  # --help, --version and usage errors print, then exit through argparse
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()
        raise
    return status


def _reader_gone() -> int:
    """stdout's reader has gone: what is still buffered goes nowhere, and the interpreter's final
    flush finds nothing to complain about."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _parse(parser: argparse.ArgumentParser, arguments: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status after one error line."""
    try:
        args = parser.parse_args(arguments)
    except UserError as error:  # an option's value from the environment, named by its variable
        print(f"gpu-profiler: error: {error}", file=sys.stderr)
        return error.exit_code
    if args.command is None:
        print(
            f"gpu-profiler: error: name a command: {', '.join(COMMAND_MODULES)} "
            "(see 'gpu-profiler --help')",
            file=sys.stderr,
        )
        return 2
    return args


def _run(arguments: list[str]) -> int:
    first = arguments[0] if arguments else None
    if first in COMMAND_MODULES or first == "--version":
        parser = build_parser(only=first)  # "--version" loads no command at all
    else:  # --help, nothing or an unknown command: argparse prints and exits
        parser = build_parser(summary=True)
    args = _parse(parser, arguments)
    if isinstance(args, int):
        return args
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
    except ModuleNotFoundError as error:  # an installation without what this command imports
        print(
            f"gpu-profiler: error: the Python module {error.name} is missing: reinstall "
            "gpu-cluster-profiler with pip (README, 'Setup')",
            file=sys.stderr,
        )
        return 2
    except SystemExit as stop:
        # Commands return their status and never exit; a rich Console that met a closed pipe
        # does, with status 1 (Console.on_broken_pipe, stdout already sent to /dev/null).
        if stop.code != 1:
            raise
        return _reader_gone()
    return status
