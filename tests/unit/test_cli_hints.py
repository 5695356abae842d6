"""Hints that lead somewhere: each bad input a newcomer typed is one line on stderr, naming what
they typed (the flag, or the environment variable the value came from), with a non-zero exit;
and output that cuts or wraps nothing a reader needs."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

from profiler_app.cli import main
from profiler_app.commands.report import table
from profiler_app.trace.export import open_report
from profiler_app.trace.render import render as render_trace
from profiler_app.trace.summary import summarise
from tests.unit.test_report import build_history
from tests.unit.test_trace_cli import training_report


def fails_in_one_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one error line of a command that must fail with exit status 2."""
    try:
        status = main(list(args))
    except SystemExit as stop:  # argparse's own errors exit through it
        status = stop.code  # type: ignore[assignment]
    assert status == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('hints') / 'profiler.db'}"
    build_history(url)
    return url


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("GPU_PROFILER_STORE_URL", "garbage", ["report"]),
        ("GPU_PROFILER_STORE_URL", "garbage", ["run", "--once"]),
        ("GPU_PROFILER_PROMETHEUS_URL", "ftp://x", ["analyze"]),
        ("GPU_PROFILER_PROMETHEUS_URL", "ftp://x", ["run", "--once"]),
        ("GPU_PROFILER_METRICS_PORT", "99999", ["run", "--once"]),
    ],
)
def test_a_bad_value_from_the_environment_names_its_variable(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    command: list[str],
) -> None:
    monkeypatch.setenv(variable, value)
    line = fails_in_one_line(capsys, *command)
    assert line.startswith(f"gpu-profiler: error: {variable}: ")
    assert value in line


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["analyze", "--window", "-5m"], "--window"),
        (["report", "-o", "xml"], "-o/--output"),
        (["report", "--by", "nodes"], "--by"),
        (["run", "--metrics-port", "99999", "--once"], "--metrics-port"),
        (["trial"], "ACTION"),
    ],
)
def test_usage_errors_are_one_line_that_points_to_help(
    capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    line = fails_in_one_line(capsys, *args)
    assert named in line
    if args[0] != "analyze":  # a negative duration is refused by the duration check itself
        assert f"(see 'gpu-profiler {args[0]} --help')" in line


def test_no_command_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    line = fails_in_one_line(capsys)
    assert "name a command: run, analyze, report" in line
    assert "gpu-profiler --help" in line


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--since", "5"], "--since 5: give a unit, e.g. 5h or 5d"),
        (["--idle-below", "150"], "--idle-below 150: a percentage from 0 to 100"),
        (["--by", "rightsize", "--headroom", "5"], "--headroom 5: a fraction of the peak"),
    ],
)
def test_report_refuses_values_it_used_to_take_silently(
    capsys: pytest.CaptureFixture[str], store: str, args: list[str], said: str
) -> None:
    line = fails_in_one_line(capsys, "report", "--store-url", store, *args)
    assert said in line


def test_a_missing_kubeconfig_says_no_such_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "kubeconfig"
    line = fails_in_one_line(capsys, "unprotect", "--kubeconfig", str(missing))
    assert f"no such file {missing}" in line


def test_an_empty_prometheus_answer_says_it_is_empty(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "empty.json"
    saved.write_text(
        json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}})
    )
    line = fails_in_one_line(capsys, "analyze", "--input", str(saved))
    assert "holds no series (an empty result)" in line
    assert "__name__" not in line


def test_an_error_answer_shows_prometheus_own_words(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The shape of Prometheus's error envelope: prometheus/prometheus web/api/v1/api.go
    (``status: error``, ``errorType``, ``error``)."""
    saved = tmp_path / "error.json"
    saved.write_text(
        json.dumps({"status": "error", "errorType": "bad_data", "error": "1:5: parse error"})
    )
    line = fails_in_one_line(capsys, "analyze", "--input", str(saved))
    assert "Prometheus answered an error: bad_data: 1:5: parse error" in line


def test_run_once_promises_no_next_try(caplog: pytest.LogCaptureFixture) -> None:
    assert (
        main(
            [
                "run",
                "--once",
                "--prometheus-url",
                "http://127.0.0.1:9",
                "--store-url",
                "none",
                "--metrics-port",
                "0",
            ]
        )
        == 1
    )
    failures = [r.getMessage() for r in caplog.records if "source error" in r.getMessage()]
    assert failures
    assert not any("next try" in message for message in failures)


def test_the_postgres_hint_installs_from_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler_app.core.errors import UserError  # noqa: PLC0415
    from profiler_app.sinks.store.urls import parse_store_url  # noqa: PLC0415

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a)
    )
    with pytest.raises(UserError, match=r"\.venv/bin/pip install -e '\.\[postgres\]'"):
        parse_store_url("postgresql://u@db/profiler")


def test_the_render_hint_names_the_render_extra(capsys: pytest.CaptureFixture[str]) -> None:
    from infra.render.__main__ import _missing  # noqa: PLC0415

    assert _missing(ModuleNotFoundError("No module named 'pulumi'", name="pulumi")) == 2
    assert "pip install -e '.[render]'" in capsys.readouterr().err
    assert _missing(ModuleNotFoundError("No module named 'ansible'", name="ansible")) == 2
    assert "pip install -e '.[render,ansible]'" in capsys.readouterr().err


def test_report_by_pod_names_its_gpu_indices_apart_from_a_node_count() -> None:
    pod_row = {"namespace": "ml", "pod": "trainer-0", "node": "n", "gpus": "0,1"}
    node_row = {"node": "n", "gpus": 2}
    assert "GPU INDICES" in table([pod_row], "pod").splitlines()[0]
    assert "GPUS" in table([node_row], "node").splitlines()[0]


def test_report_by_trace_keeps_a_25_ms_iteration() -> None:
    row = {"namespace": "ml", "pod": "p", "node": "n", "iteration_seconds": 0.025}
    assert "0.025" in table([row], "trace", wide=True)


def test_trace_cuts_no_header_on_a_narrow_terminal_and_wraps_no_prose_in_a_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = training_report(tmp_path / "report.sqlite")
    with open_report(path) as export:
        summary = summarise(export)
    piped = io.StringIO()
    render_trace(summary, piped)
    prose = [line for line in piped.getvalue().splitlines() if line.startswith("  try: ")]
    assert prose
    assert prose[0].rstrip().endswith("onto the GPU.")  # whole, not cut at 160
    monkeypatch.setenv("COLUMNS", "60")  # a 60-column terminal
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    render_trace(summary, terminal)
    assert any(len(line) <= 60 for line in terminal.getvalue().splitlines())
    assert "…" not in terminal.getvalue()
    for header in ("Time %", "StdDev", "Pageable"):
        assert header in terminal.getvalue()
