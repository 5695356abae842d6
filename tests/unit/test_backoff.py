"""The one back-off policy (profiler_app.core.backoff), on a fake clock."""

from __future__ import annotations

import pytest

from profiler_app.core.backoff import Backoff
from tests.support.clock import FakeClock


def test_delays_double_up_to_the_cap_and_a_success_resets_them() -> None:
    backoff = Backoff(30, 300, FakeClock())
    assert [backoff.failed() for _ in range(7)] == [30, 60, 120, 240, 300, 300, 300]
    backoff.succeeded()
    assert backoff.failed() == 30


def test_ready_only_once_the_delay_is_over() -> None:
    clock = FakeClock()
    backoff = Backoff(30, 300, clock)
    assert backoff.ready()
    backoff.failed()
    clock.advance(29.9)
    assert not backoff.ready()
    assert backoff.remaining() == pytest.approx(0.1)
    clock.advance(0.1)
    assert backoff.ready()
    assert backoff.remaining() == 0


def test_retry_after_lengthens_a_delay_but_is_capped() -> None:
    backoff = Backoff(30, 300, FakeClock())
    assert backoff.failed(retry_after=120) == 120
    assert backoff.failed(retry_after=10) == 60  # never shorter than the policy's own
    assert backoff.failed(retry_after=86_400) == 300  # a day-long Retry-After waits the cap


def test_the_delay_counts_from_when_the_attempt_started() -> None:
    clock = FakeClock()
    backoff = Backoff(30, 300, clock)
    started = clock()
    clock.advance(4)  # the failing call took 4 s
    backoff.failed(since=started)
    clock.advance(26)
    assert backoff.ready()  # the next cycle, 30 s after this one started, tries again


def test_nonsense_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="initial <= maximum"):
        Backoff(10, 5)
    with pytest.raises(ValueError, match="0 < initial"):
        Backoff(0, 5)
