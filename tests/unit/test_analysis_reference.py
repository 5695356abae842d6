"""The engine against the Alnair profiler's rule (re-implemented in benchmarks/alnair_rule.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

from benchmarks.alnair_rule import alnair_autocorrelations, alnair_classify
from profiler_app.analysis import JobType, classify_matrix
from tests.support import signals


def _accuracy(
    cases: list[signals.LabelledSignal], verdicts: Sequence[tuple[str, float | None]]
) -> float:
    right = 0
    for case, (job_type, period) in zip(cases, verdicts, strict=True):
        expected = case.period_seconds
        if expected is None:
            right += job_type == case.job_type and period is None
        else:
            right += job_type == case.job_type and period == pytest.approx(expected, rel=0.1)
    return right / len(cases)


def test_reference_autocorrelation_is_pandas_autocorr() -> None:
    rng = np.random.default_rng(4)
    values = signals.with_gaps(signals.sine(201, 17, rng), 0.1, rng)
    series = pd.Series(values)

    expected = [series.autocorr(lag=lag) for lag in range(100)]

    np.testing.assert_allclose(alnair_autocorrelations(values), expected, rtol=1e-7, atol=1e-9)


def test_reference_autocorrelation_matches_pandas_on_the_short_corpus_cases() -> None:
    short = [case for case in signals.labelled_corpus() if case.values.size <= 180]
    assert len(short) > 40

    for case in short:
        series = pd.Series(case.values)
        expected = [series.autocorr(lag=lag) for lag in range(case.values.size // 2)]
        np.testing.assert_allclose(
            alnair_autocorrelations(case.values), expected, rtol=1e-7, atol=1e-9, err_msg=case.name
        )


def test_reference_autocorrelation_of_a_constant_series_is_undefined_like_pandas() -> None:
    flat = np.full(40, 30.0)

    assert np.isnan(alnair_autocorrelations(flat)).all()
    assert np.isnan(pd.Series(flat).autocorr(lag=3))


def test_engine_beats_the_reference_rule_on_the_corpus() -> None:
    cases = list(signals.labelled_corpus())
    engine = [
        (result.job_type, result.period_seconds)
        for case in cases
        for result in classify_matrix(case.values[None, :], case.step_seconds)
    ]
    reference = [alnair_classify(case.values, case.step_seconds) for case in cases]

    engine_accuracy = _accuracy(cases, engine)
    reference_accuracy = _accuracy(cases, reference)

    assert engine_accuracy == 1.0
    assert reference_accuracy < 0.6
    assert engine_accuracy - reference_accuracy > 0.4


def test_reference_weaknesses_are_fixed() -> None:
    """What the reference gets wrong: 1 % noise is active, a clean square wave is not cyclic,
    a spiky loop's period comes out as one sample, a random walk is cyclic, and nothing over
    2 minutes at 10 s is ever training."""
    rng = np.random.default_rng(5)
    noise = signals.near_zero_noise(1800, rng, level=1.0)
    square = signals.square(1800, 30, rng)
    spikes = signals.spikes(1800, 45, rng, width=5)
    walk = signals.random_walk(1800, rng)
    short_square = np.tile([90.0, 90.0, 5.0, 5.0], 3)

    assert alnair_classify(noise, 1.0)[0] == "inference"
    assert alnair_classify(square, 1.0)[0] == "inference"
    assert alnair_classify(spikes, 1.0) == ("training", 1.0)
    assert alnair_classify(walk, 1.0)[0] == "training"
    assert alnair_classify(short_square, 10.0)[0] == "inference"

    results = classify_matrix(np.stack([noise, square, spikes, walk]), 1.0)
    [short] = classify_matrix(short_square[None, :], 10.0)
    assert [r.job_type for r in results] == ["idle", "training", "training", "inference"]
    assert results[1].period_seconds == pytest.approx(30.0, rel=0.05)
    assert results[2].period_seconds == pytest.approx(45.0, rel=0.05)
    assert short.job_type == JobType.TRAINING
    assert short.period_seconds == pytest.approx(40.0, rel=0.1)
