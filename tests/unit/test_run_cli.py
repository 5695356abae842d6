"""``gpu-profiler run``: flags and environment variables, configuration log, embedded default.

The embedded-default test runs the real command on this GPU-less machine: real pynvml (no
driver), real psutil, a real SQLite store in tmp_path.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from profiler_app.cli import build_parser, main
from profiler_app.commands import run as run_command
from profiler_app.commands.options import DEFAULT_FIELDS, MIG_FIELDS
from profiler_app.commands.run import RunConfig
from profiler_app.core.errors import UserError
from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, POWER_USAGE
from tests.support.environment import environment_without_settings

pytestmark = pytest.mark.usefixtures("cli_environment")


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    config = RunConfig.from_args(parse())
    assert config.prometheus_url is None
    assert config.node_label == "Hostname"
    # Local mode: NVML samples no DCGM profiling fields (MIG_FIELDS); Prometheus mode reads them.
    assert config.fields == [GPU_UTIL, MEM_COPY_UTIL, FB_USED, POWER_USAGE]
    with_prometheus = RunConfig.from_args(parse("--prometheus-url", "http://prometheus:9090"))
    assert with_prometheus.fields == [*DEFAULT_FIELDS]
    assert with_prometheus.fields[4:] == [*MIG_FIELDS]
    assert config.kubeconfig is None
    assert config.annotation_domain == "ai.centaurus.io"
    assert config.store_url == f"sqlite:///{tmp_path}/gpu-profiler/profiler.db"
    assert (config.metrics_address, config.metrics_port) == ("127.0.0.1", 9401)
    assert (config.interval_seconds, config.window_seconds) == (30.0, 1800.0)
    assert config.sample_interval_seconds == 1.0
    assert config.cgroup_root == Path("/sys/fs/cgroup")
    assert not config.once
    assert parse().log_level == "info"


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    environment = {
        "NODE_NAME": "gpu-node-7",
        "GPU_PROFILER_PROMETHEUS_URL": "http://prometheus:9090",
        "GPU_PROFILER_NODE_LABEL": "instance",
        "GPU_PROFILER_FIELDS": f"{GPU_UTIL}, {FB_USED}",
        "KUBECONFIG": "/etc/kube/config",
        "GPU_PROFILER_ANNOTATION_DOMAIN": "example.com",
        "GPU_PROFILER_STORE_URL": "none",
        "GPU_PROFILER_METRICS_PORT": "9555",
        "GPU_PROFILER_METRICS_ADDRESS": "0.0.0.0",
        "GPU_PROFILER_INTERVAL": "1m",
        "GPU_PROFILER_WINDOW": "1h",
        "GPU_PROFILER_SAMPLE_INTERVAL": "5s",
        "GPU_PROFILER_LOG_LEVEL": "DEBUG",
        "GPU_PROFILER_CGROUP_ROOT": "/host/sys/fs/cgroup",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    args = parse()
    config = RunConfig.from_args(args)
    assert config.node == "gpu-node-7"
    assert config.prometheus_url == "http://prometheus:9090"
    assert config.node_label == "instance"
    assert config.fields == [GPU_UTIL, FB_USED]
    assert config.kubeconfig == "/etc/kube/config"
    assert config.annotation_domain == "example.com"
    assert config.store_url is None
    assert (config.metrics_address, config.metrics_port) == ("0.0.0.0", 9555)
    assert (config.interval_seconds, config.window_seconds) == (60.0, 3600.0)
    assert config.sample_interval_seconds == 5.0
    assert config.cgroup_root == Path("/host/sys/fs/cgroup")
    assert args.log_level == "debug"


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_PROFILER_INTERVAL", "1m")
    monkeypatch.setenv("GPU_PROFILER_FIELDS", GPU_UTIL)
    config = RunConfig.from_args(
        parse("--interval", "10s", "--field", FB_USED, "--field", GPU_UTIL, "--once")
    )
    assert config.interval_seconds == 10.0
    assert config.fields == [GPU_UTIL, FB_USED]  # GPU utilisation is classified, as in analyze
    assert config.once


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--interval", "soon"], "--interval: malformed duration 'soon'"),
        (["--window", "0s"], "--window: malformed duration '0s'"),
        (["--store-url", "mysql://db/x"], "unsupported store URL scheme 'mysql'"),
        (
            ["--annotation-domain", "Not A Domain", "--kubeconfig", "/nonexistent"],
            "invalid annotation domain 'Not A Domain'",
        ),
        (["--sample-interval", "1h", "--window", "30m"], "--sample-interval must not be longer"),
        (["--window", "inf"], "--window: malformed duration 'inf'"),
        (["--window", "nan"], "--window: malformed duration 'nan'"),
        (["--interval", "inf"], "--interval: malformed duration 'inf'"),
        (["--window", "1000000d"], "--window: duration '1000000d' is longer than 100 years"),
        (["--interval", "1ms"], "--interval must be at least 0.1s when sampling locally"),
        (
            ["--interval", "0.4s", "--prometheus-url", "http://127.0.0.1:9"],
            "--interval must be at least 0.5s when reading Prometheus",
        ),
        (["--sample-interval", "1ms"], "--sample-interval must be at least 0.1s"),
        (["--interval", "2d"], "--interval must be at most 1d"),
        (["--retention", "forever"], "--retention: malformed duration 'forever'"),
        (["--rollup-retention", "1y"], "--rollup-retention: malformed duration '1y'"),
        (
            ["--retention", "30d", "--rollup-retention", "7d"],
            "--rollup-retention must not be shorter than --retention",
        ),
        (["--store-interval", "10s"], "--store-interval must be between --interval and --window"),
        (["--store-interval", "1h"], "--store-interval must be between --interval and --window"),
        (
            ["--prometheus-url", "http://127.0.0.1:9", "--step", "1ms"],
            "a 30m window at a 0.001s step is 1,800,000 points per GPU",
        ),
        # Local sampling would allocate the whole window's ring buffer at start.
        (["--window", "30d"], "--window 30d at --sample-interval 1s is more than the 21,600"),
        (
            ["--field", "DCGM_FI_PROF_SM_ACTIVE", "--store-url", "none", "--metrics-port", "0"],
            "local NVML sampling cannot provide DCGM_FI_PROF_SM_ACTIVE",
        ),
    ],
)
def test_bad_input_is_one_error_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--once", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-profiler: error: {message}")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "environment", "seconds"),
    [
        (["--store-url", "sqlite:////tmp/x.db"], None, (14 * 86400.0, 400 * 86400.0)),
        (["--store-url", "postgresql://u@db/gpus"], None, (14 * 86400.0, 400 * 86400.0)),
        (
            ["--store-url", "postgresql://u@db/gpus", "--retention", "30d"],
            None,
            (30 * 86400.0, 400 * 86400.0),
        ),
        (
            ["--store-url", "sqlite:////tmp/x.db", "--retention", "none"],
            None,
            (None, 400 * 86400.0),
        ),
        (["--store-url", "sqlite:////tmp/x.db"], "7d", (7 * 86400.0, 400 * 86400.0)),
        (
            ["--store-url", "sqlite:////tmp/x.db", "--retention", "1d"],
            "7d",
            (86400.0, 400 * 86400.0),
        ),
        (
            ["--store-url", "sqlite:////tmp/x.db", "--rollup-retention", "none"],
            None,
            (14 * 86400.0, None),
        ),
        (["--store-url", "none", "--retention", "1d"], None, (None, None)),
    ],
)
def test_retention_defaults(
    argv: list[str],
    environment: str | None,
    seconds: tuple[float | None, float | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if environment:
        monkeypatch.setenv("GPU_PROFILER_RETENTION", environment)
    config = RunConfig.from_args(parse(*argv))
    assert (config.retention_seconds, config.rollup_retention_seconds) == seconds


@pytest.mark.parametrize(
    ("argv", "seconds"),
    [
        (["--store-url", "sqlite:////tmp/x.db"], 0.0),  # every cycle
        (["--store-url", "postgresql://u@db/gpus"], 300.0),  # a cluster's store: 5 minutes
        (["--store-url", "postgresql://u@db/gpus", "--window", "2m"], 120.0),  # within it
        (["--store-url", "postgresql://u@db/gpus", "--store-interval", "30s"], 0.0),
        (["--store-url", "sqlite:////tmp/x.db", "--store-interval", "30s"], 0.0),  # the cycle's
        (["--store-url", "sqlite:////tmp/x.db", "--store-interval", "5m"], 300.0),
        (["--store-url", "sqlite:////tmp/x.db", "--store-interval", "30m"], 1800.0),
        (["--store-url", "none"], 0.0),
    ],
)
def test_store_interval(argv: list[str], seconds: float) -> None:
    config = RunConfig.from_args(parse(*argv))
    assert config.store_interval_seconds == seconds
    assert ("store-interval=" in config.describe()) == bool(seconds)


def test_protect_training_is_off_unless_the_flag_or_environment_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ("--store-url", "none")
    assert RunConfig.from_args(parse(*store)).protect_training == "off"
    flagged = RunConfig.from_args(parse(*store, "--protect-training"))
    assert flagged.protect_training == "on"
    assert " protect-training=on" in flagged.describe()
    released = RunConfig.from_args(parse(*store, "--protect-training=release"))
    assert released.protect_training == "release"
    for value, expected in (
        ("true", "on"),
        ("1", "on"),
        ("false", "off"),
        ("off", "off"),
        ("release", "release"),
        ("Release ", "release"),
    ):
        monkeypatch.setenv("GPU_PROFILER_PROTECT_TRAINING", value)
        assert RunConfig.from_args(parse(*store)).protect_training == expected, value
    monkeypatch.setenv("GPU_PROFILER_PROTECT_TRAINING", "maybe")
    assert main(["run", "--once", *store]) == 2
    err = capsys.readouterr().err
    assert err == (
        "gpu-profiler: error: --protect-training / GPU_PROFILER_PROTECT_TRAINING 'maybe': "
        "use on (true), off (false) or release\n"
    )


def test_a_long_window_is_fine_when_prometheus_keeps_the_samples() -> None:
    config = RunConfig.from_args(
        parse("--prometheus-url", "http://127.0.0.1:9", "--window", "30d", "--interval", "0.5s")
    )
    assert (config.window_seconds, config.interval_seconds) == (30 * 86400.0, 0.5)


def test_bad_port_and_log_level_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--metrics-port", "70000")
    assert exited.value.code == 2
    monkeypatch.setenv("GPU_PROFILER_LOG_LEVEL", "chatty")
    with pytest.raises(UserError, match=r"^GPU_PROFILER_LOG_LEVEL: unknown log level 'chatty'"):
        parse()


def test_the_first_field_is_classified_without_gpu_utilisation() -> None:
    config = RunConfig.from_args(parse("--field", FB_USED, "--field", MEM_COPY_UTIL))
    assert config.fields == [FB_USED, MEM_COPY_UTIL]


def test_kubernetes_client_is_not_imported_unless_used() -> None:
    """The client costs ~35 MiB of RSS; the CLI and an embedded run must not load it."""
    code = (
        "import sys; from profiler_app.cli import build_parser; "
        "from profiler_app.commands.run import RunConfig; "
        "RunConfig.from_args(build_parser().parse_args(['run', '--store-url', 'none'])); "
        "print('kubernetes' in sys.modules)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=environment_without_settings(),
    )
    assert completed.stdout.strip() == "False"


def test_configuration_log_hides_passwords() -> None:
    config = RunConfig.from_args(
        parse(
            "--store-url",
            "postgresql://profiler:s3cret@db.internal:5432/gpus",
            "--prometheus-url",
            "https://reader:t0ken@prometheus.example:9090",
            "--node",
            "gpu-node-2",
        )
    )
    line = config.describe()
    assert "s3cret" not in line
    assert "t0ken" not in line
    assert "store=postgresql://profiler:***@db.internal:5432/gpus" in line
    assert "prometheus=https://***@prometheus.example:9090" in line
    assert "node=gpu-node-2" in line
    assert "metrics=http://127.0.0.1:9401/metrics" in line


def test_once_embedded_default_without_a_gpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No driver here: it says so once, profiles the host, stores into SQLite, exits 0."""
    database = tmp_path / "profiler.db"
    caplog.set_level(logging.INFO)
    status = main(
        [
            "run",
            "--once",
            "--interval",
            "0.3s",
            "--sample-interval",
            "0.1s",
            "--store-url",
            f"sqlite:///{database}",
            "--metrics-port",
            "0",
            "--node",
            "workstation",
        ]
    )
    assert status == 0
    messages = [record.getMessage() for record in caplog.records]
    assert sum("no NVIDIA driver found" in message for message in messages) == 1
    assert any(
        message.startswith("gpu-profiler run: node=workstation local sampling")
        for message in messages
    )
    host_lines = [message for message in messages if message.startswith("host cpu ")]
    assert len(host_lines) == 1
    assert " mem " in host_lines[0]
    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("select name from sqlite_master")}
        assert {"gpu_window", "pod_usage"} <= tables
        assert connection.execute("select count(*) from gpu_window").fetchone() == (0,)


@pytest.mark.parametrize(
    ("mode", "samples_the_host"),
    [(("--prometheus-url", "http://127.0.0.1:9"), False), ((), True)],
    ids=["prometheus", "local"],
)
def test_the_host_sampler_runs_only_in_local_mode(
    mode: tuple[str, ...], samples_the_host: bool
) -> None:
    """In the DaemonSet's Prometheus mode nothing reads host or pod-cgroup samples."""
    config = RunConfig.from_args(parse(*mode, "--store-url", "none", "--metrics-port", "0"))
    with contextlib.ExitStack() as resources:
        daemon = run_command._build(config, resources)
        try:
            running = {thread.name for thread in threading.enumerate()}
            assert ("host-sampler" in running) is samples_the_host
            assert (daemon.cycle.inputs.host is not None) is samples_the_host
        finally:
            assert daemon.close()
    assert "host-sampler" not in {thread.name for thread in threading.enumerate()}


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://", "no host"),
        ("http://a b", "it contains a space or a control character"),
        ("http://%zz", "a % not followed by two hex digits"),
        ("https://:9090", "no host"),
        ("http://prometheus:9090/x y", "it contains a space or a control character"),
    ],
)
def test_a_prometheus_url_that_cannot_work_stops_the_daemon_at_start(
    url: str, problem: str
) -> None:
    """Not --once: such a URL used to pass the start-up check and be retried for ever."""
    done = subprocess.run(
        [sys.executable, "-m", "profiler_app", "run", "--prometheus-url", url],
        env=environment_without_settings() | {"GPU_PROFILER_STORE_URL": "none"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"gpu-profiler: error: invalid Prometheus URL {url!r} ({problem}): expected "
        "http://HOST:PORT"
    )
    assert "Traceback" not in done.stderr
