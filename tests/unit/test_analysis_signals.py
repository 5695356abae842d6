"""The labelled signal generators the analysis tests (and the Prometheus data set) rely on."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import signals


def test_corpus_is_reproducible_per_seed_and_differs_between_seeds() -> None:
    first = list(signals.labelled_corpus(3))
    again = list(signals.labelled_corpus(3))
    other = list(signals.labelled_corpus(4))

    assert [case.name for case in first] == [case.name for case in other]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.values, b.values)
    assert any(
        not np.array_equal(a.values, b.values, equal_nan=True)
        for a, b in zip(first, other, strict=True)
    )


def test_corpus_values_are_percentages_or_missing_with_unique_names() -> None:
    cases = list(signals.labelled_corpus())

    assert len({case.name for case in cases}) == len(cases)
    for case in cases:
        present = case.values[np.isfinite(case.values)]
        assert present.size > 0, case.name
        assert present.min() >= 0.0, case.name
        assert present.max() <= 100.0, case.name
        assert (case.period_seconds is not None) == (case.job_type == signals.TRAINING)


@pytest.mark.parametrize("period", [4.0, 7.5, 45.0])
def test_square_wave_repeats_every_period(period: float) -> None:
    values = signals.square(600, period, np.random.default_rng(1), noise=0.0)
    busy = values > 50

    assert busy.mean() == pytest.approx(0.5, abs=0.05)
    if period.is_integer():
        np.testing.assert_array_equal(busy[int(period) :], busy[: -int(period)])


def test_jitter_changes_iteration_lengths_but_keeps_their_mean() -> None:
    rng = np.random.default_rng(2)
    clean = signals.square(3000, 30, rng, noise=0.0)
    jittered = signals.with_jitter(clean, 30, 0.1, rng)
    rises = np.flatnonzero(np.diff((jittered > 50).astype(int)) == 1)
    lengths = np.diff(rises)

    assert lengths.min() < 29
    assert lengths.max() > 31
    assert lengths.mean() == pytest.approx(30, rel=0.03)


def test_gaps_blank_about_the_requested_fraction() -> None:
    values = signals.with_gaps(np.full(10_000, 50.0), 0.1, np.random.default_rng(3))

    assert np.isnan(values).mean() == pytest.approx(0.1, abs=0.03)


def test_eval_dip_replaces_only_its_stretch() -> None:
    loop = signals.square(600, 20, np.random.default_rng(4), noise=0.0)
    dipped = signals.with_eval_dip(loop, 100, 50, np.random.default_rng(5), level=30.0)

    np.testing.assert_array_equal(dipped[:100], loop[:100])
    np.testing.assert_array_equal(dipped[150:], loop[150:])
    assert dipped[100:150].mean() == pytest.approx(30.0, abs=2.0)


def test_random_walk_stays_in_its_band_and_bursts_leave_idle_stretches() -> None:
    rng = np.random.default_rng(6)
    walk = signals.random_walk(5000, rng, low=15.0, high=95.0)
    bursts = signals.sporadic_bursts(1800, rng, bursts=3, shortest=5, longest=20)

    assert walk.min() >= 15.0
    assert walk.max() <= 95.0
    assert np.mean(bursts < 5.0) > 0.8
    assert bursts.max() > 70.0
