"""``gpu-profiler completion bash|zsh``: a shell completion script for every command and flag.

The script is generated from the argument parser itself (by shtab), so a new command or flag
completes as soon as it exists. Install it once:

    gpu-profiler completion bash > ~/.local/share/bash-completion/completions/gpu-profiler
    gpu-profiler completion zsh > "${fpath[1]}/_gpu-profiler"
"""

from __future__ import annotations

import argparse
import sys

from profiler_app.commands import SUMMARIES

SHELLS = ("bash", "zsh")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "completion",
        help=SUMMARIES["completion"],
        description="Print a completion script for every gpu-profiler command and flag. Install "
        "it with `gpu-profiler completion bash > "
        "~/.local/share/bash-completion/completions/gpu-profiler`, or for zsh into a folder "
        'of $fpath as _gpu-profiler (`gpu-profiler completion zsh > "${fpath[1]}/_gpu-profiler"`).',
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell: %(choices)s")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import shtab  # noqa: PLC0415  (only this command uses it)

    # The whole parser, with every command: the CLI hands over how to build it.
    sys.stdout.write(shtab.complete(args.full_parser(), shell=args.shell))
    return 0
