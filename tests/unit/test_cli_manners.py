"""Command-line manners: completion scripts, report's narrow and wide tables, the spinner, the
JSON envelopes and what the start-up line says about Kubernetes.

Completion is checked in a real bash: the generated script is sourced and its completion
function asked, as bash asks it on Tab. zsh, where installed, checks its script's syntax.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from profiler_app.cli import build_parser, main
from profiler_app.commands import progress
from profiler_app.commands.report import NARROW_COLUMNS, RIGHTSIZE_VIEW
from profiler_app.commands.run import RunConfig
from profiler_app.reports.history import REPORT_VIEWS, view_columns
from tests.support.nsys.builder import ReportBuilder
from tests.unit.test_report import RANGE_ARGS, build_history

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('manners') / 'profiler.db'}"
    build_history(url)
    return url


def completion_script(shell: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-m", "profiler_app", "completion", shell],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return completed.stdout


def bash_completes(script: str, words: list[str]) -> list[str]:
    """What bash offers for the last of ``words`` (the word being completed, maybe empty)."""
    array = " ".join(f"'{word}'" for word in words)
    program = f"""
source {script}
COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}
COMP_LINE="${{COMP_WORDS[*]}}"; COMP_POINT=${{#COMP_LINE}}
function=$(complete -p gpu-profiler | sed -E 's/.* -F ([^ ]+) .*/\\1/')
"$function" gpu-profiler "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    completed = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    return completed.stdout.split()


def test_bash_completes_commands_flags_and_choices(tmp_path: Path) -> None:
    script = tmp_path / "gpu-profiler.bash"
    script.write_text(completion_script("bash"))
    [commands] = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(bash_completes(str(script), ["gpu-profiler", ""])) >= set(commands.choices)  # type: ignore[arg-type]
    assert bash_completes(str(script), ["gpu-profiler", "an"]) == ["analyze"]
    assert "--store-url" in bash_completes(str(script), ["gpu-profiler", "report", "--s"])
    views = [*REPORT_VIEWS, RIGHTSIZE_VIEW]
    assert bash_completes(str(script), ["gpu-profiler", "report", "--by", ""]) == views
    assert bash_completes(str(script), ["gpu-profiler", "analyze", "-o", ""]) == [
        "table",
        "wide",
        "json",
    ]


def test_zsh_script_defines_the_completion() -> None:
    script = completion_script("zsh")
    assert script.startswith("#compdef gpu-profiler")
    assert "report" in script
    assert "--store-url" in script
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed: only the script's content was checked")
    checked = subprocess.run([zsh, "-n"], input=script, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_narrow_report_leaves_the_rest_to_wide(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--store-url", store, *RANGE_ARGS]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert main(["report", "--store-url", store, *RANGE_ARGS, "-o", "wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert narrow[0] == wide[0] == "GPUs, 4h up to 2026-01-01T04:00:00Z"
    assert narrow[1].split() == [
        *("NODE", "GPU", "IDLE", "h", "TRAINING", "h", "INFERENCE", "h", "BURSTY", "h"),
        *("IDLE", "GPU", "h", "UTIL", "MAX", "%"),
    ]
    for header in ("UUID", "COVERED h", "OTHER h"):  # memory columns: empty in this history
        assert header not in narrow[1]
        assert header in wide[1]
    assert len(wide[2]) > len(narrow[2])
    uuid = wide[2].split()[2]
    assert uuid == "GPU-node-a-0"  # never cut, however long


def test_empty_columns_are_hidden_and_units_are_in_the_headers(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The history's pods have no owner and no memory readings: those columns go; the pod's
    name and namespace always stay."""
    assert main(["report", "--store-url", store, *RANGE_ARGS, "--by", "pod", "-o", "wide"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert header.split()[:2] == ["NAMESPACE", "POD"]
    assert "GPU h" in header
    assert "GPU UTIL MAX %" in header
    for empty in ("OWNER KIND", "FB USED MAX MiB", "MEM USED MAX MiB", "CPU UTIL MAX %"):
        assert empty not in header


def test_every_narrow_column_exists_in_its_view() -> None:
    for view, columns in NARROW_COLUMNS.items():
        assert columns <= set(view_columns(view)), view


def test_report_json_is_an_envelope_with_a_format_version(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["report", "--store-url", store, *RANGE_ARGS, "--node", "node-b", "-o", "json"]) == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert list(document) == ["kind", "format_version", "view", "since", "until", "node", "rows"]
    assert (document["kind"], document["format_version"], document["node"]) == (
        "report",
        1,
        "node-b",
    )
    assert [list(row) for row in document["rows"]] == [view_columns("gpu")]


def test_trace_json_names_its_kind_and_format_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = ReportBuilder(gpus={0: "NVIDIA H100 80GB HBM3"})
    report.add_kernels("gemm", np.arange(20) * 1_000_000, 900_000)
    path = report.write(tmp_path / "report.sqlite")
    assert main(["trace", str(path), "--store-url", "none", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document)[:2] == ["kind", "format_version"]
    assert (document["kind"], document["format_version"]) == ("trace", 1)


def test_a_missing_module_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_args: object) -> int:
        raise ModuleNotFoundError("No module named 'shtab'", name="shtab")

    monkeypatch.setattr("profiler_app.commands.completion.handle", broken)
    assert main(["completion", "bash"]) == 2
    assert capsys.readouterr().err == (
        "gpu-profiler: error: the Python module shtab is missing: reinstall gpu-cluster-profiler "
        "with pip (README, 'Setup')\n"
    )


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_slow_query_shows_a_spinner_on_a_terminal() -> None:
    screen = Terminal()
    with progress.spinner("reading the store", delay=0.05, stream=screen):
        time.sleep(0.5)
    assert "reading the store" in screen.getvalue()


def test_a_quick_query_shows_nothing() -> None:
    screen = Terminal()
    with progress.spinner("reading the store", delay=5.0, stream=screen):
        pass
    assert screen.getvalue() == ""


def test_no_spinner_into_a_pipe() -> None:
    pipe = io.StringIO()
    with progress.spinner("reading the store", delay=0.0, stream=pipe):
        time.sleep(0.2)
    assert pipe.getvalue() == ""


@pytest.mark.parametrize(
    ("kubeconfig", "service_host", "said"),
    [
        ("/srv/me/.kube/config", None, "kubernetes=/srv/me/.kube/config "),
        (None, "10.96.0.1", "kubernetes=in-cluster "),
        (None, None, "kubernetes=off "),
    ],
)
def test_the_start_up_line_says_what_kubernetes_access_was_resolved(
    monkeypatch: pytest.MonkeyPatch, kubeconfig: str | None, service_host: str | None, said: str
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    if service_host:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", service_host)
    arguments = [
        "run",
        "--store-url",
        "none",
        *(["--kubeconfig", kubeconfig] if kubeconfig else []),
    ]
    config = RunConfig.from_args(build_parser("run").parse_args(arguments))
    assert said in config.describe()


def test_a_duration_from_the_environment_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_PROFILER_INTERVAL", "0.01s")
    assert main(["run", "--once", "--store-url", "none", "--metrics-port", "0"]) == 2
    assert capsys.readouterr().err == (
        "gpu-profiler: error: GPU_PROFILER_INTERVAL must be at least 0.1s when sampling locally\n"
    )
