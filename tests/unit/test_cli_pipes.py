"""Every command into a pipe whose reader has gone (``| head -1``): exit 0, no traceback.

A closed pipe is a normal end, as for ``git log | head``. Each command runs through the real
console entry point in a child process, twice: with ``| head -1`` in a shell under
``pipefail`` (what users type), and with its stdout on a pipe whose read end is already closed,
so that every write fails at once (``head`` may read a short output whole before closing: the
second run makes the check deterministic). The commands come from the parser itself: a new
command is covered by its ``--help`` at once; the cases below add real output of each command.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from profiler_app.cli import build_parser, main
from tests.support.nsys.builder import ReportBuilder
from tests.unit.test_report import RANGE_ARGS, build_history

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "prometheus-query-range.json"
GPU_PROFILER = [sys.executable, "-m", "profiler_app"]


def subcommands() -> list[str]:
    parser = build_parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    return sorted(commands.choices)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('pipes') / 'profiler.db'}"
    build_history(url)
    return url


@pytest.fixture(scope="module")
def nsys_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    report = ReportBuilder(gpus={0: "NVIDIA H100 80GB HBM3"})
    for step in range(50):
        report.add_kernels("gemm", step * 20_000_000 + np.arange(5) * 1_000_000, 900_000)
    return report.write(tmp_path_factory.mktemp("pipes") / "report.sqlite")


def closed_reader(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` with stdout on a pipe nobody reads any more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            argv,
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)


def into_head(argv: list[str]) -> subprocess.CompletedProcess[str]:
    command = f"set -o pipefail; {shlex.join(argv)} | head -1 >/dev/null"
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def assert_quiet_end(argv: list[str]) -> None:
    for completed in (closed_reader(argv), into_head(argv)):
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert "Traceback" not in completed.stderr
        assert "Exception ignored" not in completed.stderr
        assert "BrokenPipeError" not in completed.stderr


@pytest.mark.parametrize("command", [*subcommands(), None])
def test_help_of_every_command_into_a_closed_pipe(command: str | None) -> None:
    assert_quiet_end([*GPU_PROFILER, *([command] if command else []), "--help"])


@pytest.mark.parametrize(
    "arguments",
    [
        ["analyze", "--input", str(EXAMPLE)],
        ["analyze", "--input", str(EXAMPLE), "-o", "wide"],
        ["analyze", "--input", str(EXAMPLE), "-o", "json"],
        ["run", "--once", "--interval", "0.3s", "--store-url", "none", "--metrics-port", "0"],
        ["completion", "bash"],
        ["completion", "zsh"],
        ["--version"],
    ],
)
def test_output_into_a_closed_pipe(arguments: list[str]) -> None:
    assert_quiet_end([*GPU_PROFILER, *arguments])


@pytest.mark.parametrize("output", ["table", "wide", "json", "csv"])
def test_report_into_a_closed_pipe(store: str, output: str) -> None:
    argv = ["report", "--store-url", store, *RANGE_ARGS, "--by", "pod", "-o", output]
    assert_quiet_end([*GPU_PROFILER, *argv])


@pytest.mark.parametrize("output", ["table", "json"])
def test_trace_into_a_closed_pipe(nsys_report: Path, output: str) -> None:
    argv = ["trace", str(nsys_report), "--store-url", "none", "-o", output]
    assert_quiet_end([*GPU_PROFILER, *argv])


def test_render_help_into_a_closed_pipe() -> None:
    assert_quiet_end([sys.executable, "-m", "infra.render", "--help"])


def test_any_command_is_covered_by_the_cli_itself(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quiet end lives in ``main``, not in each command: a handler whose writes fail with
    EPIPE (what a command added later does into ``| head``) still ends with exit 0."""

    class GoneReader:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return sys.__stdout__.fileno() if sys.__stdout__ else 1

    def chatty(_args: object) -> int:
        print("a line no one reads")
        return 0

    monkeypatch.setattr("profiler_app.commands.completion.handle", chatty)
    monkeypatch.setattr(os, "dup2", lambda _a, _b: None)  # keep pytest's own stdout
    monkeypatch.setattr(sys, "stdout", GoneReader())
    assert main(["completion", "bash"]) == 0
