"""``gpu-profiler report``: placeholder until its issue lands."""

import argparse

from profiler_app.errors import UserError


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser("report", help="(not available yet)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    raise UserError("'report' is not available yet")
