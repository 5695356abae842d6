"""The profiling loop running: it waits the backed-off interval, stops quickly even under a hung
cycle, closes its sources before its sinks (and nothing under a cycle it abandoned), survives a
sink that fails to close, and its heartbeat stays fresh while backing off but goes stale while a
cycle hangs.

The source and sinks are test doubles (tests/support/daemon_doubles.py); these run the real loop
in a thread, on real time with short intervals.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest

from profiler_app.core.errors import SourceError
from tests.support.daemon_doubles import RecordingSink, ScriptedSource, make_daemon


def test_loop_waits_the_backed_off_interval_and_stops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="profiler_app.daemon")
    source = ScriptedSource([SourceError("down")] * 3)
    store = RecordingSink("store")
    daemon, _ = make_daemon(source, store, interval=0.05)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not store.received and time.monotonic() < deadline:
        time.sleep(0.02)
    daemon.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert source.reads >= 4
    assert store.received
    assert "source recovered after 3 failure(s)" in caplog.text


def test_stop_abandons_a_hung_cycle_quickly() -> None:
    source = ScriptedSource()
    source.block = threading.Event()
    store = RecordingSink("store")
    daemon, _ = make_daemon(source, store)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(daemon.run()))
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    daemon.stop()
    thread.join(5)
    assert exit_codes == [0]
    assert time.monotonic() - started < 3
    source.block.set()


def test_close_stops_the_sources_before_the_sinks() -> None:
    order: list[str] = []
    sources = contextlib.ExitStack()
    sources.callback(order.append, "stop pod watcher")
    sources.callback(order.append, "stop sampler")
    daemon, _ = make_daemon(ScriptedSource(), RecordingSink("store", log=order), sources=sources)
    assert daemon.run(once=True) == 0
    assert daemon.close()
    assert order == ["stop sampler", "stop pod watcher", "close store"]


def test_nothing_is_closed_under_an_abandoned_cycle() -> None:
    """A cycle hung past the stop grace keeps its sources and sinks open; once it has ended,
    close works as usual."""
    order: list[str] = []
    sources = contextlib.ExitStack()
    sources.callback(order.append, "stop sampler")
    source = ScriptedSource()
    source.block = threading.Event()
    store = RecordingSink("store", log=order)
    daemon, _ = make_daemon(source, store, sources=sources)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    time.sleep(0.2)
    daemon.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert not daemon.close()
    assert order == []
    source.block.set()
    deadline = time.monotonic() + 5
    while not daemon.close() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert order == ["stop sampler", "close store"]


def test_close_survives_a_failing_sink() -> None:
    class BrokenClose(RecordingSink):
        def close(self) -> None:
            raise OSError("flush failed")

    broken = BrokenClose("store")
    other = RecordingSink("kubernetes")
    daemon, _ = make_daemon(ScriptedSource(), broken, other)
    daemon.close()
    assert other.closed


def test_heartbeat_stays_fresh_while_backing_off() -> None:
    """A loop waiting out a long backoff is alive; /healthz must not restart it."""
    source = ScriptedSource([SourceError("down")] * 50)
    daemon, metrics = make_daemon(source, interval=0.1, stale_after=0.3)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        while daemon.cycle.source_part.backoff.failures < 4:  # waits of 0.8 s and more
            time.sleep(0.05)
        ages = []
        for _ in range(20):
            ages.append(metrics.heartbeat.age())
            time.sleep(0.05)
        assert max(ages) < 0.3
    finally:
        daemon.stop()
        thread.join(5)


def test_heartbeat_goes_stale_while_a_cycle_hangs() -> None:
    source = ScriptedSource()
    source.block = threading.Event()
    daemon, metrics = make_daemon(source, interval=0.1, stale_after=0.3)
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        time.sleep(0.6)
        assert not metrics.heartbeat.alive()
    finally:
        daemon.stop()
        thread.join(5)
        source.block.set()
