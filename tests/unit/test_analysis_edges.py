"""The analysis engine's statistics, gap filling and edge cases (shapes, NaN, tiny windows)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from profiler_app.analysis import (
    IDLE_THRESHOLD_PERCENT,
    JobType,
    classify_matrix,
    field_stats,
    periodicity,
)
from profiler_app.analysis.gaps import fill_gaps
from profiler_app.analysis.recurrence import idle_window_fraction
from tests.support import signals


def test_field_stats_match_numpys_nan_aware_reductions() -> None:
    rng = np.random.default_rng(1)
    matrix = rng.uniform(0, 100, (50, 301))
    matrix[rng.uniform(size=matrix.shape) < 0.2] = np.nan
    matrix[3] = np.nan
    matrix[4, :] = np.nan
    matrix[4, 7] = 42.0

    stats = field_stats(matrix)

    assert len(stats) == 50
    for row, row_stats in zip(matrix, stats, strict=True):
        valid = row[np.isfinite(row)]
        if valid.size == 0:
            assert all(math.isnan(value) for value in vars(row_stats).values())
            continue
        assert row_stats.max == pytest.approx(valid.max())
        assert row_stats.p95 == pytest.approx(np.percentile(valid, 95))
        assert row_stats.mean == pytest.approx(valid.mean())
        assert row_stats.idle_fraction == pytest.approx(np.mean(valid < IDLE_THRESHOLD_PERCENT))


def test_field_stats_work_for_fields_that_are_not_percentages() -> None:
    framebuffer_mib = np.array([[61000.0, 61200.0, np.nan, 60900.0]])

    [stats] = field_stats(framebuffer_mib)

    assert stats.max == 61200.0
    assert stats.p95 == pytest.approx(61180.0)
    assert stats.mean == pytest.approx(61033.33, rel=1e-6)
    assert stats.idle_fraction == 0.0


def test_field_stats_accept_nested_lists_and_integers() -> None:
    [stats] = field_stats([[0, 10, 20]])

    assert (stats.max, stats.mean) == (20.0, 10.0)
    assert stats.idle_fraction == pytest.approx(1 / 3)


def test_fill_gaps_interpolates_linearly_and_holds_the_edges() -> None:
    nan = np.nan
    matrix = np.array(
        [
            [nan, 10.0, nan, nan, 40.0, nan],
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [nan, nan, nan, nan, nan, nan],
        ]
    )

    filled = fill_gaps(matrix)

    np.testing.assert_allclose(filled[0], [10, 10, 20, 30, 40, 40])
    np.testing.assert_array_equal(filled[1], matrix[1])
    np.testing.assert_array_equal(filled[2], np.zeros(6))
    assert np.isnan(matrix[0, 0])  # the input is left alone


def test_fill_gaps_returns_complete_matrices_unchanged() -> None:
    matrix = np.arange(12, dtype=float).reshape(3, 4)

    assert fill_gaps(matrix) is matrix


def test_all_missing_row_is_idle_with_nan_statistics() -> None:
    rng = np.random.default_rng(2)
    matrix = np.stack([np.full(600, np.nan), signals.square(600, 20, rng)])

    missing, training = classify_matrix(matrix, 1.0)

    assert missing.job_type == JobType.IDLE
    assert missing.period_seconds is None
    assert all(math.isnan(value) for value in vars(missing.stats).values())
    assert training.job_type == JobType.TRAINING


@pytest.mark.parametrize("shape", [(0, 100), (3, 0), (0, 0)])
def test_empty_matrices_do_not_crash(shape: tuple[int, int]) -> None:
    results = classify_matrix(np.empty(shape), 1.0)

    assert len(results) == shape[0]
    assert all(result.job_type == JobType.IDLE for result in results)


@pytest.mark.parametrize("columns", [1, 2, 5, 11])
def test_windows_too_short_for_three_iterations_are_never_training(columns: int) -> None:
    alternating = np.tile([90.0, 10.0], 6)[:columns]

    [result] = classify_matrix(alternating[None, :], 10.0)

    assert result.job_type != JobType.TRAINING
    assert result.period_seconds is None


def test_twelve_samples_hold_three_iterations_of_four() -> None:
    values = np.tile([90.0, 90.0, 10.0, 10.0], 3)

    [result] = classify_matrix(values[None, :], 10.0)

    assert result.job_type == JobType.TRAINING
    assert result.period_seconds == pytest.approx(40.0, rel=0.1)


def test_constant_load_is_inference_and_constant_zero_is_idle() -> None:
    matrix = np.array([[70.0] * 300, [0.0] * 300])

    busy, idle = classify_matrix(matrix, 1.0)

    assert (busy.job_type, idle.job_type) == (JobType.INFERENCE, JobType.IDLE)


def test_one_noise_blip_is_idle_but_seconds_of_work_are_bursty() -> None:
    """A reading just above the idle threshold once is noise (0.3 s of work at a 10 s step);
    one sample at 80 % is 7.5 s of real work, and two bursts are bursts whatever their size."""
    noise_blip = np.zeros(12)
    noise_blip[5] = 8.0
    one_job = np.zeros(12)
    one_job[5] = 80.0
    two_bursts = one_job.copy()
    two_bursts[9] = 80.0

    blip, job, bursts = classify_matrix(np.stack([noise_blip, one_job, two_bursts]), 10.0)

    assert blip.job_type == JobType.IDLE
    assert job.job_type == JobType.BURSTY
    assert bursts.job_type == JobType.BURSTY


def test_a_one_second_sample_at_full_load_is_idle_but_two_are_not() -> None:
    """At a 1 s step one sample can hold at most 0.95 s of work above the threshold."""
    one = np.zeros(600)
    one[300] = 100.0
    two = one.copy()
    two[301] = 100.0

    first, second = classify_matrix(np.stack([one, two]), 1.0)

    assert first.job_type == JobType.IDLE
    assert second.job_type == JobType.BURSTY


def test_low_noise_is_idle_not_active() -> None:
    rng = np.random.default_rng(3)
    noise = signals.near_zero_noise(1800, rng, level=1.0)

    [result] = classify_matrix(noise[None, :], 1.0)

    assert result.job_type == JobType.IDLE
    assert result.stats.idle_fraction == 1.0


def test_infinite_samples_count_as_missing() -> None:
    [stats] = field_stats([[np.inf, 10.0, -np.inf, 30.0]])

    assert (stats.max, stats.mean) == (30.0, 20.0)


def test_job_types_are_plain_strings() -> None:
    assert [str(job_type) for job_type in JobType] == ["idle", "training", "inference", "bursty"]
    assert JobType("training") is JobType.TRAINING
    assert isinstance(JobType.TRAINING, str)


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0], [[[1.0]]]])
def test_matrices_that_are_not_two_dimensional_are_refused(values: object) -> None:
    with pytest.raises(ValueError, match="2-D"):
        classify_matrix(values, 1.0)


@pytest.mark.parametrize("step", [0.0, -1.0, math.nan])
def test_step_must_be_positive(step: float) -> None:
    with pytest.raises(ValueError, match="step_seconds"):
        classify_matrix(np.zeros((1, 10)), step)


def test_idle_window_fraction_counts_windows_without_a_busy_sample() -> None:
    busy_every_four = np.tile([90.0, 0.0, 0.0, 0.0], 5)
    busy_twice = np.zeros(20)
    busy_twice[[0, 4]] = 90.0

    fractions = idle_window_fraction(
        np.stack([busy_every_four, busy_twice]),
        p95=np.array([90.0, 90.0]),
        period=np.array([4.0, 4.0]),
    )

    # 17 windows of 4 samples fit in 20; the second row's windows starting at 5..16 are idle.
    np.testing.assert_allclose(fractions, [0.0, 12 / 17])


def test_results_do_not_depend_on_how_rows_are_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [case for case in signals.labelled_corpus() if case.values.size == 1800]
    matrix = np.stack([case.values for case in cases])
    whole = classify_matrix(matrix, 1.0)

    monkeypatch.setattr(periodicity, "SAMPLES_PER_CHUNK", 3 * 1800)  # three rows per batch
    batched = classify_matrix(matrix, 1.0)

    assert [r.job_type for r in batched] == [r.job_type for r in whole]
    np.testing.assert_allclose(
        [r.period_seconds or np.nan for r in batched],
        [r.period_seconds or np.nan for r in whole],
        rtol=1e-9,
    )
