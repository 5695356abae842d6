"""The README and the docs hold what the code does.

- Every flag and environment variable of each command's ``--help`` is in that command's table in
  the docs, and every flag and variable of the table is in ``--help``. The commands come from the
  argument parsers: a new command needs a table, marked ``<!-- flags: gpu-profiler NAME -->``.
- Every ``gpu-profiler`` and ``python -m infra.render`` command line in a code block names a
  command and flags that exist.
- Blocks marked ``<!-- runnable -->`` run as they are, after the README's own setup (this
  checkout's .venv), without a cluster: ``sh`` blocks must exit 0, ``console`` blocks must print
  what they show.
- Nothing users cannot use: no issue numbers, remarks about where the text was written, absolute
  paths of the machine it was written on, kubeconfigs written into the work tree.
- The troubleshooting guide starts from every alert the stacks install; the README's annotation
  example is what the profiler writes for the example dump.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from infra import versions
from infra.chart_cache import chart_cache
from infra.render import CHECK_NAMES
from infra.render.__main__ import build_parser as build_render_parser
from infra.render.charts import missing_archives
from infra.render.checks import CHECKS
from profiler_app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    {
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "benchmarks" / "RESULTS.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / folder / "README.md" for folder in ("stacks", "playbooks", "infra")),
        *(ROOT / "tests").glob("*/README.md"),
        *(ROOT / "playbooks" / "roles").glob("*/README.md"),
    }
)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MARKED_FENCE = re.compile(r"<!-- runnable -->\n```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FLAGS_MARKER = re.compile(r"<!-- flags: (.+?) -->\n((?:\|.*\n)+)")
ENV_IN_HELP = re.compile(r"\(env ([A-Z][A-Z0-9_]+)")
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$|^[A-Z]{4,}$")
BACKTICKED = re.compile(r"`([^`]+)`")
VENV_BIN = Path(sys.executable).parent


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- the command-line parsers ------------------------------------------------------------------


def gpu_profiler_commands() -> dict[str, argparse.ArgumentParser]:
    [commands] = [a for a in build_parser()._actions if a.dest == "command"]
    return dict(commands.choices)  # type: ignore[arg-type]


def with_subcommands(
    name: str, parser: argparse.ArgumentParser
) -> dict[str, argparse.ArgumentParser]:
    """A command's parser, or, for a command with actions of its own (``trial plan``), each
    action's parser under its full name."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not nested:
        return {name: parser}
    return {
        full: sub
        for action in nested
        for child, child_parser in action.choices.items()
        for full, sub in with_subcommands(f"{name} {child}", child_parser).items()
    }


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {
        full: sub
        for name, p in gpu_profiler_commands().items()
        for full, sub in with_subcommands(f"gpu-profiler {name}", p).items()
    }
    parsers["python -m infra.render"] = build_render_parser()
    return parsers


def help_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help", "--version")
    }


def help_env(parser: argparse.ArgumentParser) -> set[str]:
    return {name for action in parser._actions for name in ENV_IN_HELP.findall(action.help or "")}


@dataclass
class FlagTable:
    path: Path
    flags: set[str]
    env: set[str]


def cells_of(row: str) -> list[str]:
    """A Markdown table row's cells (``\\|`` is a pipe inside a cell)."""
    return re.split(r"(?<!\\)\|", row)


def flag_tables() -> dict[str, list[FlagTable]]:
    tables: dict[str, list[FlagTable]] = {}
    for path in DOCS:
        for command, table in FLAGS_MARKER.findall(text(path)):
            header, _separator, *rows = table.splitlines()
            env_column = next(
                (i for i, cell in enumerate(cells_of(header)) if "environment" in cell.lower()),
                None,
            )
            flags: set[str] = set()
            env: set[str] = set()
            for row in rows:
                cells = cells_of(row)
                for token in BACKTICKED.findall(cells[1]):
                    words = [word.rstrip(",") for word in token.split()]
                    flags |= {word for word in words if word.startswith("--")}
                if env_column is not None:
                    for token in BACKTICKED.findall(cells[env_column]):
                        if ENV_NAME.match(token.split()[0]):
                            env.add(token.split()[0])
            tables.setdefault(command, []).append(FlagTable(path, flags, env))
    return tables


@pytest.mark.parametrize("command", sorted(all_parsers()))
def test_help_and_docs_name_the_same_flags_and_variables(command: str) -> None:
    parser = all_parsers()[command]
    found = flag_tables().get(command, [])
    assert len(found) == 1, (
        f"{command}: expected one table of its flags in the docs, preceded by the line "
        f"`<!-- flags: {command} -->`; found {len(found)}"
    )
    [table] = found
    where = relative(table.path)
    assert table.flags == help_flags(parser), (
        f"{where}: in --help only: {sorted(help_flags(parser) - table.flags)}; "
        f"in the table only: {sorted(table.flags - help_flags(parser))}"
    )
    assert table.env == help_env(parser), (
        f"{where}: in --help only: {sorted(help_env(parser) - table.env)}; "
        f"in the table only: {sorted(table.env - help_env(parser))}"
    )


def test_render_help_lists_every_check() -> None:
    assert tuple(CHECKS) == CHECK_NAMES
    text_of_help = " ".join(build_render_parser().format_help().split())
    assert all(name in text_of_help for name in CHECK_NAMES)


# -- command lines in code blocks --------------------------------------------------------------


def command_lines() -> list[tuple[Path, str]]:
    """Every line of a code block that runs gpu-profiler or python -m infra.render."""
    found = []
    for path in DOCS:
        for _language, block in FENCE.findall(text(path)):
            joined = block.replace("\\\n", " ")
            for raw in joined.splitlines():
                line = raw.strip().removeprefix("$ ")
                if re.search(r"(^|[\s/])gpu-profiler [a-z-]+|-m infra\.render", line):
                    found.append((path, line))
    return found


def invocation(line: str) -> list[str] | None:
    """The words of the gpu-profiler or render invocation on a line, up to a pipe, redirect or
    comment; None when the line only mentions one (e.g. in prose)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    for index, word in enumerate(words):
        if word.endswith("gpu-profiler") or (
            word == "-m" and words[index + 1 :][:1] == ["infra.render"]
        ):
            rest = words[index + (1 if word.endswith("gpu-profiler") else 2) :]
            cut = next(
                (i for i, w in enumerate(rest) if w in ("|", ">", ">>", "&&", ";", "2>")), None
            )
            return ["render" if word == "-m" else "gpu-profiler", *rest[:cut]]
    return None


@pytest.mark.parametrize(
    ("path", "line"),
    command_lines(),
    ids=[f"{relative(path)}:{line[:40]}" for path, line in command_lines()],
)
def test_command_lines_use_existing_commands_and_flags(path: Path, line: str) -> None:
    words = invocation(line)
    if words is None or len(words) < 2:
        return
    if words[0] == "render":
        parser = build_render_parser()
        arguments = words[1:]
    else:
        commands = gpu_profiler_commands()
        if words[1].startswith("-") or words[1].endswith(":"):
            return  # --version / --help, or a line it printed ("gpu-profiler trial: ...")
        assert words[1] in commands, f"{relative(path)}: no command {words[1]!r} in: {line}"
        parser = commands[words[1]]
        arguments = words[2:]
        while actions := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]:
            choices = {name: sub for action in actions for name, sub in action.choices.items()}
            if not arguments or arguments[0] not in choices:
                break  # a synopsis such as `trial plan|run|report|clean`
            parser, arguments = choices[arguments[0]], arguments[1:]
    known = {option for action in parser._actions for option in action.option_strings}
    for word in arguments:
        word = word.lstrip("[")  # noqa: PLW2901  a usage synopsis: [--flag VALUE]
        if word.startswith("-") and not word.startswith("---") and not re.match(r"^-\d", word):
            flag = word.split("=", 1)[0]
            assert flag in known, f"{relative(path)}: {flag} is no option of: {line}"


# -- runnable blocks ---------------------------------------------------------------------------


def runnable_blocks() -> list[tuple[Path, str, str]]:
    return [
        (path, language, block)
        for path in DOCS
        for language, block in MARKED_FENCE.findall(text(path))
    ]


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The README's setup: this checkout's .venv first on PATH; a home of its own, so that what
    the blocks write under ~ (completion scripts, kubeconfigs, the default store) stays there."""
    home = tmp_path_factory.mktemp("home")
    charts = str(chart_cache())  # the user's, though HOME moves
    return {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GPU_CLUSTER_CHART_CACHE": charts,
        "COLUMNS": "80",
    }


def shell(command: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{command}"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "language", "block"),
    runnable_blocks(),
    ids=[f"{relative(p)}:{b.splitlines()[0][:50]}" for p, _, b in runnable_blocks()],
)
def test_runnable_block(path: Path, language: str, block: str, environment: dict[str, str]) -> None:
    if not (ROOT / ".venv" / "bin" / "gpu-profiler").exists():
        pytest.skip("no .venv in this checkout: the README's setup (scripts/run) makes it")
    stack_charts = [c for c in versions.PINNED_CHARTS if c is not versions.EFA_DEVICE_PLUGIN]
    missing = missing_archives(stack_charts) if "infra.render stacks" in block else []
    if missing:
        pytest.skip(f"chart cache {chart_cache()} lacks {', '.join(missing)}: run `--pull-charts`")
    if language == "console":
        for command, expected in console_steps(block):
            completed = shell(command, environment)
            assert completed.returncode == 0, f"{relative(path)}: $ {command}\n{completed.stderr}"
            shown = [line.rstrip() for line in completed.stdout.splitlines()]
            assert shown == expected, f"{relative(path)}: $ {command} prints otherwise"
    else:
        assert language == "sh", f"{relative(path)}: runnable blocks are sh or console"
        completed = shell(block, environment)
        assert completed.returncode == 0, (
            f"{relative(path)}:\n{block}\n{completed.stdout[-2000:]}{completed.stderr[-3000:]}"
        )


def console_steps(block: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line.rstrip())
    return steps


def test_the_docs_have_runnable_blocks() -> None:
    where = {relative(path) for path, _, _ in runnable_blocks()}
    assert {"README.md", "docs/analyze.md", "stacks/README.md", "playbooks/README.md"} <= where


# -- what users cannot use ---------------------------------------------------------------------

INTERNAL = [
    (re.compile(r"\bissues? \d+\b|\bdefect \d+\b", re.IGNORECASE), "an issue number"),
    (re.compile(r"where (this|it) was (written|measured)", re.IGNORECASE), "where it was written"),
    (re.compile(r"(?<![\w.~])/(?:work|root|home/\w+)/"), "a path of the machine it was written on"),
    (
        re.compile(r"\.\./shared\b|\bshared/(?:charts|traces|notes|tools)\b"),
        "the dev machine's ../shared",
    ),
    # "here" meaning the machine the project was built on, in the phrasings it took.
    (
        re.compile(
            r"\b(?:run for real|was available|no GPU|any of this|not been run|loads|needs more "
            r"than \S+ \S+|could not be read|cannot run) here\b|\bhere it took\b|\(here `",
            re.IGNORECASE,
        ),
        "'here' meaning the development machine",
    ),
]
# What a user gets: every text file of these folders, and test modules (docstrings, comments).
SHIPPED_FOLDERS = ("profiler_app", "infra", "stacks", "playbooks", "scripts", "docs", "benchmarks")
SHIPPED_SUFFIXES = {
    "",
    ".py",
    ".md",
    ".yaml",
    ".yml",
    ".ini",
    ".j2",
    ".sh",
    ".toml",
    ".cfg",
    ".txt",
}


def shipped_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", *SHIPPED_FOLDERS, "tests", "README.md", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    paths = [ROOT / name for name in listed if name]
    return [
        p
        for p in paths
        if p.is_file()
        and p.suffix in SHIPPED_SUFFIXES
        and (p.parts[len(ROOT.parts)] != "tests" or p.suffix in {".py", ".md"})
    ]


def internal_notes(path: Path) -> list[str]:
    where = relative(path) if path.is_relative_to(ROOT) else path.name
    return [
        f"{where}:{number} has {what}: {line.strip()}"
        for number, line in enumerate(text(path).splitlines(), 1)
        for pattern, what in INTERNAL
        if pattern.search(line)
    ]


@pytest.mark.parametrize("path", DOCS, ids=relative)
def test_no_internal_notes(path: Path) -> None:
    assert internal_notes(path) == []


def test_no_internal_notes_in_anything_shipped() -> None:
    this_file = Path(__file__).resolve()
    files = [p for p in shipped_files() if p.resolve() != this_file]
    assert len(files) > 300
    assert [note for path in files for note in internal_notes(path)] == []


@pytest.mark.parametrize(
    "leak",
    [
        "Run by hand (from a checkout with ``../shared/traces``).",
        "The nspawn flags come from /work/shared/notes/test-nodes.md: this machine's",
        "# The settings issue 10 gives kubeadm GPU nodes",
        '"""The smoke suite tells expired credentials apart (issue 24, item 10)."""',
        "Where a procedure was run for real here, it says so;",
        "was available here to check them against.",
        "- No GPU has run any of this here: the device plugin's",
        "(`pytest`; the charts from `../shared/charts`)",
        "providers and a Kubernetes API cannot run here), every Helm release",
        "| kube-prometheus-stack | not yet: their index could not be read here | pinned |",
        "a branch change on a real GPU host has not been run here, so",
        "(no GPU here: ...)",
        "SQLite 3.40 needs more than 2 s here: the goal",
    ],
)
def test_the_internal_notes_check_catches(leak: str, tmp_path: Path) -> None:
    leaky = tmp_path / "leaky.md"
    leaky.write_text(f"fine\n{leak}\n")
    assert internal_notes(leaky)


KUBECONFIG_IN_TREE = re.compile(
    r"(>\s*|--kubeconfig[ =]|KUBECONFIG=)(\$PWD/|\./|\.\./)*(\.\./)*kubeconfig\b"
)


@pytest.mark.parametrize("path", DOCS, ids=relative)
def test_kubeconfigs_are_never_written_into_the_work_tree(path: Path) -> None:
    for number, line in enumerate(text(path).splitlines(), 1):
        assert not KUBECONFIG_IN_TREE.search(line), (
            f"{relative(path)}:{number} puts a kubeconfig in the work tree (use ~/.kube/): {line}"
        )


def test_troubleshooting_starts_from_every_alert() -> None:
    rules = yaml.safe_load(text(ROOT / "infra" / "monitoring" / "rules.yaml"))
    alerts = {
        rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule
    }
    guide = text(ROOT / "docs" / "operations.md")
    assert alerts
    assert {alert for alert in alerts if f"`{alert}`" not in guide} == set()


def test_the_readme_annotation_example_is_what_the_profiler_writes() -> None:
    from profiler_app.commands.options import classified_first  # noqa: PLC0415
    from profiler_app.core.model import CycleResult  # noqa: PLC0415
    from profiler_app.profiles.build import build_profiles  # noqa: PLC0415
    from profiler_app.sinks.kubernetes.values import node_annotations  # noqa: PLC0415
    from profiler_app.sources.prometheus import load_query_range  # noqa: PLC0415

    matrices = load_query_range(str(ROOT / "examples" / "prometheus-query-range.json"), None)
    fields = classified_first([matrix.field for matrix in matrices])
    profiles = build_profiles(matrices, fields[0], node_label="Hostname")
    result = CycleResult("gpu-node-1", datetime.now(UTC), 1800.0, profiles)
    written = node_annotations(result, "ai.centaurus.io")
    shown = re.findall(r"(ai\.centaurus\.io/gpu-[\w-]+): (.+)", text(ROOT / "README.md"))
    assert len(shown) >= 5
    for key, value in shown:
        assert written.get(key) == value.strip(), key


def test_the_readme_first_screen_serves_three_readers() -> None:
    """Within its first 60 lines: who it is for, and the shortest path for node provisioning, a
    cluster with `pulumi up`, and the profiler alone."""
    first_screen = "\n".join(text(ROOT / "README.md").splitlines()[:60])
    for path in ("playbooks/site.yml", "pulumi up", "scripts/run"):
        assert path in first_screen, path
    assert "```mermaid" in text(ROOT / "README.md")
