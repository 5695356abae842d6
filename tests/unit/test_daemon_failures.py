"""The profiling loop's faults: a failing source or sink is isolated from the others and backed
off (a Retry-After obeyed), an unexpected exception is counted and not fatal, health says what
fails; sinks that act on the pods alone go on while the source fails, and a sink failing for some
pods only is not backed off.

The source and sinks are test doubles (tests/support/daemon_doubles.py); time is a
``FakeClock`` advanced one interval per cycle.
"""

from __future__ import annotations

import logging

import pytest

from profiler_app.core.errors import ItemsFailedError, RetryLaterError, SourceError
from tests.support.clock import FakeClock
from tests.support.daemon_doubles import (
    RecordingSink,
    ScriptedSource,
    cycles_every_interval,
    errors,
    failures,
    make_daemon,
    pod_info,
)


def test_a_failing_sink_does_not_stop_the_others_and_backs_off() -> None:
    kubernetes = RecordingSink("kubernetes", failures=3)
    store = RecordingSink("store")
    clock = FakeClock()
    daemon, metrics = make_daemon(ScriptedSource(), kubernetes, store, clock=clock)
    outcomes = cycles_every_interval(daemon, clock, 9)
    assert len(store.received) == 9
    # Failures 1, 2, 3 wait 1, 2, 4 intervals: attempts at cycles 1, 2, 4, then 8 and 9 succeed.
    assert kubernetes.attempts == 5
    assert len(kubernetes.received) == 2
    assert outcomes == [False, False, False, False, False, False, False, True, True]
    assert errors(metrics, "kubernetes") == 3
    assert errors(metrics, "store") == 0
    assert metrics.registry.get_sample_value("gpu_profiler_cycle_duration_seconds_count") == 9


def test_source_failures_back_off_and_recover() -> None:
    source = ScriptedSource([SourceError("connection refused"), SourceError("HTTP 503"), None])
    store = RecordingSink("store")
    clock = FakeClock()
    daemon, metrics = make_daemon(source, store, clock=clock)
    # Failures at cycles 1 and 2 wait 1 and 2 intervals: cycle 3 reads nothing, cycle 4 works.
    assert cycles_every_interval(daemon, clock, 4) == [False, False, False, True]
    assert source.reads == 3
    assert len(store.received) == 1
    assert errors(metrics, "source") == 2
    assert failures(metrics, "source") == 0


def test_a_waiting_sink_is_not_a_success(caplog: pytest.LogCaptureFixture) -> None:
    """While a sink waits out a Retry-After, cycles are not done: last_success stays, nothing
    is logged as recovered and the back-off is not reset; /healthz names the failing sink."""
    caplog.set_level(logging.INFO, logger="profiler_app.daemon")
    kubernetes = RecordingSink(
        "kubernetes", failures=2, error=RetryLaterError("HTTP 429", retry_after=120)
    )
    clock = FakeClock(start=1_700_000_000.0)
    daemon, metrics = make_daemon(ScriptedSource(), kubernetes, clock=clock)
    last_success = "gpu_profiler_last_success_timestamp_seconds"

    outcomes = cycles_every_interval(daemon, clock, 9)

    # 429 at t=0 (wait 120 s), cycles at 30..90 wait, 429 again at 120 (wait 120 s: Retry-After
    # beats the doubled 60 s), cycles at 150..210 wait, success at 240.
    assert outcomes == [False] * 8 + [True]
    assert kubernetes.attempts == 3
    assert metrics.registry.get_sample_value(last_success) == 1_700_000_000.0 + 240
    assert caplog.text.count("kubernetes recovered after 2 failure(s)") == 1
    assert "next try in 120s" in caplog.text
    assert errors(metrics, "kubernetes") == 2
    assert failures(metrics, "kubernetes") == 0


def test_health_tells_the_truth_during_an_outage() -> None:
    kubernetes = RecordingSink("kubernetes", failures=100)
    clock = FakeClock()
    daemon, metrics = make_daemon(ScriptedSource(), kubernetes, clock=clock)
    cycles_every_interval(daemon, clock, 20)  # 10 minutes
    # Tries at 0, 0.5, 1.5, 3.5 and 7.5 minutes (waits of 1, 2, 4, 8 intervals), none between.
    assert kubernetes.attempts == 5
    assert failures(metrics, "kubernetes") == 5
    summary = metrics.health_summary()
    assert "no success yet" in summary
    assert "failing: kubernetes (5 in a row)" in summary


def test_unexpected_exceptions_are_counted_not_fatal() -> None:
    source = ScriptedSource([ValueError("bad json"), None])
    clock = FakeClock()
    daemon, metrics = make_daemon(source, RecordingSink("store"), clock=clock)
    assert daemon.run(once=True) == 1
    clock.advance(daemon.interval_seconds)
    assert daemon.run(once=True) == 0
    assert errors(metrics, "source") == 1


# -- sinks that act on the pods alone; sinks failing for some pods only --------------------------


class PodsOnlySink(RecordingSink):
    """Like the training protector: it acts on the pod list without GPU series."""

    acts_without_metrics = True


def test_while_the_source_fails_only_the_sinks_that_need_no_metrics_get_the_pods() -> None:
    clock = FakeClock()
    source = ScriptedSource([SourceError("prometheus is down")] * 2)
    protection, store = PodsOnlySink("protection"), RecordingSink("store")
    daemon, metrics = make_daemon(source, protection, store, pods=lambda: [pod_info()], clock=clock)

    assert cycles_every_interval(daemon, clock, 2) == [False, False]

    assert store.received == []
    assert [(r.gpus, r.gpus_read) for r in protection.received] == [([], False)] * 2
    assert protection.received[0].node_pods == (pod_info(),)
    assert errors(metrics, "source") == 2
    assert daemon.run_cycle() is False  # the source waits out its back-off: the pods go on
    assert len(protection.received) == 3
    assert source.reads == 2
    clock.advance(120)
    assert daemon.run_cycle() is True
    assert protection.received[-1].gpus_read is True


def test_a_sink_failing_for_some_pods_is_not_backed_off_and_health_names_them() -> None:
    clock = FakeClock()
    failing = {"aaa/old": "HTTP 500 Internal Server Error, 1 in a row"}
    protection = PodsOnlySink("protection", failures=2, error=ItemsFailedError("x", failing, 1))
    daemon, metrics = make_daemon(ScriptedSource(), protection, clock=clock)

    assert cycles_every_interval(daemon, clock, 3) == [False, False, True]

    assert protection.attempts == 3  # tried every cycle: the pods back off on their own
    assert failures(metrics, "protection") == 0
    assert errors(metrics, "protection") == 2
    gauge = metrics.registry.get_sample_value("gpu_profiler_failing_pods", {"kind": "protection"})
    assert gauge == 0
    protection.failures = 1
    daemon.run_cycle()
    assert "protection failing for 1 pod(s): aaa/old (HTTP 500" in metrics.health_summary()
