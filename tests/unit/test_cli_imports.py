"""Start-up: ``gpu-profiler --help`` lists the commands without importing one, each command
imports its own module and no other command's, ``report`` leaves the store layer (SQLAlchemy)
unloaded until its arguments are good, ``run``, ``analyze`` and ``report --help`` load no client
stack (numpy, requests, Kubernetes, SQLAlchemy, prometheus_client), and ``trial`` loads no
verb's handler before it runs. New processes, ``sys.modules`` inspected."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from profiler_app.cli import COMMAND_MODULES

HEAVY = ("sqlalchemy", "alembic", "numpy", "yaml", "requests", "rich", "kubernetes", "psycopg")
# What the daemon publishes and reads through: never needed to parse a command line.
CLIENTS = ("prometheus_client", "urllib3", "pynvml", "psutil")
# What the packages holding the options' defaults load on first use of their other names.
DEFERRED = (
    "profiler_app.sources.prometheus.client",
    "profiler_app.sinks.store.sink",
    "profiler_app.reports.rightsizing.advice",
)


def _modules(*arguments: str) -> set[str]:
    probe = (
        "import sys, json; from profiler_app.cli import main\n"
        f"try: main({list(arguments)!r})\n"
        "except SystemExit: pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    return set(json.loads(done.stderr.splitlines()[-1]))


def loaded(*arguments: str) -> tuple[set[str], set[str]]:
    """(command modules, heavy top-level packages) in ``sys.modules`` after the command line."""
    modules = _modules(*arguments)
    commands = {name for name, module in COMMAND_MODULES.items() if module in modules}
    return commands, {name for name in HEAVY if name in modules}


def test_the_top_level_help_imports_no_command() -> None:
    assert loaded("--help") == (set(), set())


def test_an_unknown_command_imports_no_command() -> None:
    assert loaded("repot") == (set(), set())


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_each_command_imports_its_own_module_only(command: str) -> None:
    commands, _ = loaded(command, "--help")
    assert commands == {command}


def test_report_help_and_bad_arguments_leave_the_store_layer_unloaded() -> None:
    assert loaded("report", "--help") == ({"report"}, set())
    assert loaded("report", "--since", "soon") == ({"report"}, set())


def test_trace_help_loads_neither_numpy_nor_the_store_layer() -> None:
    assert loaded("trace", "--help") == ({"trace"}, set())


TRIAL_HANDLERS = ("plan", "run", "report", "clean", "common")


@pytest.mark.parametrize(
    "arguments",
    [
        ("trial", "--help"),
        *(("trial", verb, "--help") for verb in ("plan", "run", "report", "clean")),
        ("trial", "run", "--plan", "plan.json"),  # a usage error: --budget-gpu-hours missing
    ],
    ids=" ".join,
)
def test_trial_help_and_usage_errors_load_no_handler(arguments: tuple[str, ...]) -> None:
    """Parsing needs neither the runner, the Kubernetes client, the terminal UI, numpy nor
    the store: each verb's module is imported when the verb runs."""
    modules = _modules(*arguments)
    assert {name for name, module in COMMAND_MODULES.items() if module in modules} == {"trial"}
    assert {name for name in HEAVY if name in modules} == set()
    handlers = {f"profiler_app.commands.trial.{name}" for name in TRIAL_HANDLERS}
    assert not handlers & modules
    assert "profiler_app.trial.runner" not in modules


@pytest.mark.parametrize("command", ["run", "analyze", "report"])
def test_run_analyze_and_report_help_load_no_client_stack(command: str) -> None:
    """Their options' defaults come from light modules (``sources.prometheus.defaults``,
    ``sinks.store.urls``, ``rightsizing.defaults``): no Prometheus or Kubernetes client, numpy,
    store or daemon."""
    modules = _modules(command, "--help")
    assert {name for name, module in COMMAND_MODULES.items() if module in modules} == {command}
    assert {name for name in (*HEAVY, *CLIENTS) if name in modules} == set()
    assert not {"profiler_app.daemon", *DEFERRED} & modules
