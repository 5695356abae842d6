"""No duration or URL given to the command line ever produces a traceback (property-based).

Hypothesis feeds ``main`` in-process with arbitrary text, well-formed and near-miss durations
(huge counts, ``inf``, ``nan``, exponents) and URLs. Every run must end with exit status 0 or 2,
and whatever reaches stderr must be the command's own error line, never a traceback.

``report`` reads a real SQLite store migrated by ``TableStore``. ``analyze`` reads the saved
``query_range`` answer in examples/. ``run`` parses and validates for real and starts its real
parts (local sampler, NVML without a driver, the Prometheus client) with the store and /metrics
off; only ``Daemon.run`` is a stand-in (a test double that checks every wait it would make is one a
thread can make, then returns 0), because one cycle would wait out the interval and talk to the
network.
"""

from __future__ import annotations

import contextlib
import io
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profiler_app.cli import main
from profiler_app.daemon import Daemon
from profiler_app.sinks.store import TableStore

ROOT = Path(__file__).resolve().parents[2]
SAVED_ANSWER = ROOT / "examples" / "prometheus-query-range.json"
STARTED: list[Daemon] = []  # daemons the run stand-in started
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

numbers = st.one_of(
    st.integers(min_value=0, max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["inf", "nan", "-inf", "1e400", "1e-400", "0.0", "-0", "1_000", "٣"]),
)
# Known edges, drawn often: the unbounded, the too long, the too short, the plain.
edges = st.sampled_from(
    ["inf", "nan", "-inf", "1e400", "1000000d", "99999999999w", "1ms", "0", "0.05s", "30m", "1s"]
)
durations = st.one_of(
    edges,
    st.text(max_size=20),
    st.builds(
        lambda number, unit: number + unit,
        numbers,
        st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "y", "S"]),
    ),
    st.lists(
        st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**12), st.sampled_from("smhdw")),
        min_size=1,
        max_size=4,
    ).map("".join),
)
hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[::1", "user:pw@127.0.0.1", ""]),
    st.text(max_size=15),
)
ports = st.one_of(st.integers(-1, 70000).map(str), st.text(max_size=6), st.just(""))
urls = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda scheme, host, port, path: f"{scheme}://{host}:{port}{path}",
        st.sampled_from(["http", "https", "ftp", "HTTP", "", "sqlite", "mysql", "postgresql"]),
        hosts,
        ports,
        st.sampled_from(["", "/", "/prometheus", "/x?y=1", "/db"]),
    ),
)
# Store URLs that cannot reach a network host: SQLite paths (absent ones) and schemes refused
# before connecting; a PostgreSQL URL only on a closed local port.
store_urls = st.one_of(
    st.text(max_size=30),
    st.builds(lambda path: f"sqlite:///{path}", st.text(max_size=20)),
    st.sampled_from(["none", "sqlite://", "sqlite:///:memory:", "postgresql://u:pw@127.0.0.1:1/d"]),
    st.builds(lambda s: f"{s}://h/db", st.sampled_from(["mysql", "oracle", "postgresql+asyncpg"])),
)


pytestmark = pytest.mark.usefixtures("cli_environment")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'profiler.db'}"
    TableStore(url).close()
    return url


def run_main(*argv: str) -> tuple[int, str]:
    """``main``'s exit status and stderr; SystemExit (argparse) counts as its status."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(list(argv))
        except SystemExit as exited:
            status = exited.code if isinstance(exited.code, int) else 2
    return status, err.getvalue()


def assert_clean(status: int, err: str) -> None:
    assert status in {0, 2}, err
    assert "Traceback" not in err
    # The command's own lines: its error line, a notice such as "no gpu data", argparse usage.
    # "gpu-profiler: error: ..." or argparse's "gpu-profiler run: error: ... (see ... --help)"
    assert err == "" or err.startswith("gpu-profiler"), err
    assert (status == 0) == ("error:" not in err), err


@SETTINGS
@given(since=durations, until=st.one_of(st.none(), st.sampled_from(["0001-01-02", "9999-12-31"])))
def test_report_since_until(store: str, since: str, until: str | None) -> None:
    argv = ["report", "--store-url", store, "--since", since, "--output", "json"]
    assert_clean(*run_main(*argv, *(["--until", until] if until else [])))


@SETTINGS
@given(url=store_urls)
def test_report_store_url(url: str) -> None:
    assert_clean(*run_main("report", "--store-url", url))


@SETTINGS
@given(window=durations, step=durations)
def test_analyze_window_and_step(window: str, step: str) -> None:
    assert_clean(
        *run_main("analyze", "--input", str(SAVED_ANSWER), "--window", window, "--step", step)
    )


def run_stand_in(daemon: Daemon, *, once: bool, first_delay_seconds: float) -> int:
    """Stands in for ``Daemon.run``: every wait it would make must be one a thread can make."""
    assert once
    for seconds in (first_delay_seconds, daemon.interval_seconds):
        assert 0 <= seconds <= threading.TIMEOUT_MAX
    STARTED.append(daemon)
    return 0


@SETTINGS
@example(window="30m", interval="30s", sample_interval="1s", prometheus_url=None, step=None)
@example(
    window="100w", interval="1d", sample_interval="1s", prometheus_url="http://u:p@h:9", step="1h"
)
@example(  # urlsplit raises on the unclosed bracket: found by this test on 2026-11-23
    window="30m", interval="30s", sample_interval="1s", prometheus_url="https://[::1:1/", step=None
)
@given(
    window=st.one_of(durations, st.just("30m")),
    interval=st.one_of(durations, st.just("30s")),
    sample_interval=st.one_of(durations, st.just("1s")),
    prometheus_url=st.one_of(st.none(), urls),
    step=st.one_of(st.none(), durations),
)
def test_run_durations_and_urls(
    window: str, interval: str, sample_interval: str, prometheus_url: str | None, step: str | None
) -> None:
    argv = ["run", "--once", "--store-url", "none", "--metrics-port", "0", "--window", window]
    argv += ["--interval", interval, "--sample-interval", sample_interval]
    argv += ["--prometheus-url", prometheus_url] if prometheus_url is not None else []
    argv += ["--step", step] if step is not None else []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Daemon, "run", run_stand_in)
        assert_clean(*run_main(*argv))


def test_the_run_property_reaches_the_daemon() -> None:
    """The explicit examples above pass validation: the stand-in's checks did run."""
    STARTED.clear()
    test_run_durations_and_urls()
    assert len(STARTED) >= 2
