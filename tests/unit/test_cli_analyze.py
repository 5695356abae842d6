"""``gpu-profiler analyze`` on the saved example dump and on every kind of bad input.

Test double: ``StandInPrometheus`` (http.server on 127.0.0.1) answers like Prometheus where a
case needs an HTTP answer; the real server is used in tests/integration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from profiler_app.cli import main
from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, POWER_USAGE, SM_ACTIVE
from tests.support.prometheus import (
    Reply,
    StandInPrometheus,
    error_reply,
    free_port,
    matrix_reply,
)

EXAMPLE = Path(__file__).parents[2] / "examples" / "prometheus-query-range.json"
EXPECTED_EXAMPLE = {"0": "training", "1": "inference", "2": "idle", "3": "bursty"}


pytestmark = pytest.mark.usefixtures("cli_environment")


def busy_gpus(params: dict[str, str]) -> Reply:
    """Two GPUs of whichever node was asked for: one serving, one idle."""
    node = params["query"].split('"')[1]
    start, end, step = (float(params[key]) for key in ("start", "end", "step"))
    times = np.arange(start, end + step / 2, step)
    rng = np.random.default_rng(1)
    serving = 50 + rng.normal(0, 5, times.size)
    return matrix_reply(
        [
            {
                "metric": {"Hostname": node, "gpu": str(gpu), "UUID": f"GPU-{gpu}"},
                "values": [[t, f"{v:.1f}"] for t, v in zip(times, row, strict=True)],
            }
            for gpu, row in ((0, serving), (1, np.zeros(times.size)))
        ]
    )


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    status = main(["analyze", *arguments])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_table_from_the_example_dump(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "--input", str(EXAMPLE))
    assert (status, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split()[:6] == ["NODE", "GPU", "POD", "JOB", "TYPE", "PERIOD"]
    assert "GPU_UTIL MAX %" in header
    assert header.endswith("IDLE %  REASONS")
    assert "UUID" not in header  # -o wide has it, and the other fields' maxima
    assert "FB_USED" not in header
    assert {row.split()[1]: row.split()[3] for row in rows} == EXPECTED_EXAMPLE
    training = rows[0].split()
    assert training[2] == "ml/llama-finetune-0"
    assert training[4] == "2m"  # the loop's 120 s period


def test_wide_table_has_every_column_with_its_unit(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "--input", str(EXAMPLE), "-o", "wide")
    assert (status, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split()[:7] == ["NODE", "GPU", "UUID", "POD", "JOB", "TYPE", "BASIS"]
    for column in ("GPU_UTIL MAX %", "P95 %", "MEAN %", "IDLE %", "MEM_COPY_UTIL MAX %"):
        assert f"  {column}  " in header
    assert "  FB_USED MAX MiB  " in header
    assert "  POWER_USAGE MAX W  " in header
    assert [row.split()[5] for row in rows] == ["util-loop", "steady", "idle", "bursty"]


def test_an_empty_column_is_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    """PERIOD is "-" for every GPU but the training one: without it, the column goes."""
    status, out, _ = run(capsys, "--input", str(EXAMPLE), "--field", FB_USED)
    assert status == 0
    assert "PERIOD" not in out.splitlines()[0]
    assert out.splitlines()[0].split()[:3] == ["NODE", "GPU", "POD"]


def test_json_from_the_example_dump(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--input", str(EXAMPLE), "--output", "json")
    assert status == 0
    document = json.loads(out)
    assert (document["kind"], document["format_version"]) == ("analyze", 1)
    records = document["gpus"]
    assert [(r["gpu"], r["job_type"]) for r in records] == sorted(EXPECTED_EXAMPLE.items())
    assert [r["basis"] for r in records] == ["util-loop", "steady", "idle", "bursty"]
    for record in records:
        assert {"gpu", "UUID", "device", "modelName", "Hostname", "instance", "job"} <= set(
            record["labels"]
        )
        assert set(record["stats"]) == {GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE}
        assert record["reasons"]
        assert 0 < record["confidence"] < 1
        assert set(record["stats"][GPU_UTIL]) == {"max", "p95", "mean", "idle_fraction"}
    assert abs(records[0]["period_seconds"] - 120) < 12
    assert records[1]["period_seconds"] is None
    assert records[2]["pod"] is None
    assert records[3]["labels"]["pod"] == "batch-embed-28811"


def test_a_field_the_input_lacks_is_a_warning_unless_it_is_classified(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the console script, so the warning is the one line a user sees on stderr."""
    script = shutil.which("gpu-profiler", path=str(Path(sys.executable).parent))
    assert script is not None
    fields = ["--field", GPU_UTIL, "--field", SM_ACTIVE]
    completed = subprocess.run(
        [script, "analyze", "--input", str(EXAMPLE), *fields],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0
    [warning] = completed.stderr.splitlines()
    assert warning.endswith(f"{EXAMPLE} has no {SM_ACTIVE} series; going on without it")
    assert "WARNING" in warning
    assert len(completed.stdout.splitlines()) == 5
    status, _, err = run(capsys, "--input", str(EXAMPLE), "--field", SM_ACTIVE)
    assert status == 2
    assert err == f"gpu-profiler: error: {EXAMPLE} has no {SM_ACTIVE} series\n"


def test_prometheus_without_memory_copy_utilisation_still_analyses(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Fields other than the classified one are optional: a missing one is one warning."""

    def util_only(params: dict[str, str]) -> Reply:
        return busy_gpus(params) if GPU_UTIL in params["query"] else matrix_reply([])

    with StandInPrometheus(util_only) as server:
        status, out, _ = run(capsys, "--prometheus-url", server.url, "--node", "n1", "-o", "json")
    assert status == 0
    assert [record["job_type"] for record in json.loads(out)["gpus"]] == ["inference", "idle"]
    warnings = [record.message for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 3  # MEM_COPY_UTIL, FB_USED and POWER_USAGE, once each
    assert all("going on without it" in line for line in warnings)
    assert f"no {MEM_COPY_UTIL} series for Hostname=n1" in warnings[0]


def test_input_with_a_field_selects_it(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--input", str(EXAMPLE), "--field", FB_USED, "--output", "json")
    assert status == 0
    assert all(set(record["stats"]) == {FB_USED} for record in json.loads(out)["gpus"])


def test_piped_table_is_neither_wrapped_nor_truncated() -> None:
    """The console script through a pipe, with a narrow terminal width announced."""
    script = shutil.which("gpu-profiler", path=str(Path(sys.executable).parent))
    assert script is not None
    completed = subprocess.run(
        f"{script} analyze --input {EXAMPLE} -o wide | cat",
        shell=True,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "40"},
        check=True,
    )
    lines = completed.stdout.splitlines()
    assert len(lines) == 5
    uuid_column = lines[0].index("UUID")
    assert all(line.index("GPU-") == uuid_column for line in lines[1:])  # aligned
    assert all(len(line.split()[2]) == 40 for line in lines[1:])  # full UUIDs
    assert all(len(line) > 40 for line in lines)
    assert completed.stderr == ""


def test_prometheus_url_and_node_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with StandInPrometheus(busy_gpus) as server:
        monkeypatch.setenv("GPU_PROFILER_PROMETHEUS_URL", server.url)
        monkeypatch.setenv("NODE_NAME", "gpu-7")
        monkeypatch.setenv("GPU_PROFILER_FIELDS", f"{GPU_UTIL}, {FB_USED}")
        monkeypatch.setenv("GPU_PROFILER_WINDOW", "10m")
        status, out, _ = run(capsys, "--output", "json", "--step", "5s")
    assert status == 0
    assert [r["query"] for r in server.requests] == [
        f'{GPU_UTIL}{{Hostname="gpu-7"}} or {GPU_UTIL}{{hostname="gpu-7"}}',
        f'{FB_USED}{{Hostname="gpu-7"}} or {FB_USED}{{hostname="gpu-7"}}',
    ]
    first = server.requests[0]
    assert float(first["end"]) - float(first["start"]) == 600
    assert float(first["step"]) == 5
    records = json.loads(out)["gpus"]
    assert [(r["hostname"], r["job_type"]) for r in records] == [
        ("gpu-7", "inference"),
        ("gpu-7", "idle"),
    ]


def test_flags_override_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_PROFILER_FIELDS", FB_USED)
    monkeypatch.setenv("GPU_PROFILER_NODE_LABEL", "instance")
    with StandInPrometheus(busy_gpus) as server:
        arguments = ["--prometheus-url", server.url, "--node", "n", "--node-label", "Hostname"]
        status, _, _ = run(capsys, *arguments, "--field", GPU_UTIL, "--field", MEM_COPY_UTIL)
    assert status == 0
    assert [r["query"].split("{")[0] for r in server.requests] == [GPU_UTIL, MEM_COPY_UTIL]
    assert all('{Hostname="n"}' in r["query"] for r in server.requests)


def test_help_shows_defaults_and_environment_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["analyze", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for expected in (
        "GPU_PROFILER_WINDOW; default: 30m",
        "GPU_PROFILER_NODE_LABEL; default: Hostname",
        f"default: {GPU_UTIL}, {MEM_COPY_UTIL}, {FB_USED}",
        "GPU_PROFILER_PROMETHEUS_URL",
        "env NODE_NAME",
        "GPU_PROFILER_STEP; default: 10s",
    ):
        assert expected in text


def one_error_line(capsys: pytest.CaptureFixture[str], arguments: list[str], expected: str) -> None:
    status, out, err = run(capsys, *arguments)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpu-profiler: error: ")
    assert expected in err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("[1, 2", "is not valid JSON"),
        (
            '{"status": "success", "data": {"resultType": "vector", "result": []}}',
            "not a Prometheus",
        ),
        ('{"status": "error", "error": "x"}', "not a Prometheus query_range document"),
        ("[" * 100_000 + "]" * 100_000, "is nested too deeply to be a query_range answer"),
        ('{"a":' * 5_000 + "1" + "}" * 5_000, "is nested too deeply to be a query_range answer"),
    ],
)
def test_bad_input_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "dump.json"
    if content is not None:
        path.write_text(content)
    one_error_line(capsys, ["--input", str(path)], expected)


def test_no_source_given(capsys: pytest.CaptureFixture[str]) -> None:
    one_error_line(capsys, [], "give --prometheus-url URL")


def test_unreachable_prometheus(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    one_error_line(
        capsys,
        ["--prometheus-url", url, "--node", "n"],
        f"cannot reach Prometheus at {url}: Connection refused",
    )


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (error_reply(400, "parse error: unexpected"), "(HTTP 400): parse error: unexpected"),
        (error_reply(503, "overloaded"), "answered HTTP 503: overloaded"),
        ((200, "hello"), "does not look like Prometheus"),
        (matrix_reply([]), "no series for Hostname=gpu-404 in the last 30m: unknown node"),
    ],
)
def test_prometheus_answers(
    capsys: pytest.CaptureFixture[str], reply: Reply, expected: str
) -> None:
    with StandInPrometheus(lambda _params: reply) as server:
        one_error_line(capsys, ["--prometheus-url", server.url, "--node", "gpu-404"], expected)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--window", "half an hour"], "--window: malformed duration 'half an hour'"),
        (["--window=-5m"], "--window: malformed duration"),
        (["--step", "0s"], "--step: malformed duration"),
        (["--window", "1m", "--step", "5m"], "step 5m is longer than the window 1m"),
        (["--field", "not a metric"], "invalid metric name 'not a metric'"),
        (["--node-label", "host-name"], "invalid label name"),
        (["--prometheus-url", "localhost:9090"], "invalid Prometheus URL"),
    ],
)
def test_malformed_options(
    capsys: pytest.CaptureFixture[str], arguments: list[str], expected: str
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never reached: options fail first
    one_error_line(capsys, ["--prometheus-url", url, "--node", "n", *arguments], expected)


def test_malformed_window_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error names where the value came from: the variable, not the flag."""
    monkeypatch.setenv("GPU_PROFILER_WINDOW", "soon")
    one_error_line(
        capsys,
        ["--prometheus-url", "http://127.0.0.1:9"],
        "gpu-profiler: error: GPU_PROFILER_WINDOW: malformed duration 'soon'",
    )


def test_input_says_which_options_it_ignores(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Options given on the command line that a saved answer cannot use are named once; the same
    values from the environment (the DaemonSet's) are not the user's doing and stay quiet."""
    status, out, err = run(capsys, "--input", str(EXAMPLE), "--window", "5m", "--node", "x")
    assert (status, len(out.splitlines())) == (0, 5)
    assert err == (
        "gpu-profiler: warning: --input ignores --node and --window: the file's samples are "
        "analysed as they are\n"
    )
    monkeypatch.setenv("GPU_PROFILER_WINDOW", "5m")
    monkeypatch.setenv("NODE_NAME", "x")
    assert run(capsys, "--input", str(EXAMPLE))[2] == ""


def test_malformed_window_is_refused_with_input_too(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["analyze", "--input", str(EXAMPLE), "--window", "3x"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert "--window" in err
