"""The checks that tell an iteration loop from a cadence (profiler_app.analysis.iteration)."""

from __future__ import annotations

import numpy as np

from profiler_app.analysis import Basis, JobType, classify_matrix
from profiler_app.analysis.iteration import (
    MIN_HALF_ITERATIONS,
    half_periods,
    never_computes,
    pause_share,
)
from tests.support import jobs, signals


def test_a_loop_pauses_when_each_stretch_falls_to_half_its_peak() -> None:
    rng = np.random.default_rng(1)
    square = signals.square(600, 20, rng, duty=0.7)  # 95 % then 5 %
    climbing, _ = jobs.generate_calls(600, rng)  # 62 % -> 97 %, never below
    shares = pause_share(np.stack([square, climbing]), np.arange(2), np.array([20.0, 76.0]))
    assert shares.tolist() == [1.0, 0.0]
    # Rows are read in place: the second row alone, and a gap is skipped.
    climbing[100:140] = np.nan
    matrix = np.stack([square, climbing])
    assert pause_share(matrix, np.array([1]), np.array([76.0])).tolist() == [0.0]


def test_power_pauses_where_utilisation_reads_a_flat_100() -> None:
    """A rank spinning in a collective reads 100 % while its power falls: power pauses."""
    util = np.full((2, 600), 100.0)
    phase = np.arange(600) % 60 < 12
    watts = np.stack([np.where(phase, 150.0, 560.0), np.where(phase, 430.0, 560.0)])
    shares = pause_share(
        util, np.arange(2), np.array([60.0, 60.0]), watts, floor=np.array([70.0, 70.0])
    )
    assert shares.tolist() == [1.0, 0.0]  # 150 W is near the floor; 430 W of 560 W is not


def test_stretches_that_do_not_fit_twice_are_not_judged() -> None:
    assert pause_share(np.full((1, 100), 90.0), np.arange(1), np.array([60.0])).tolist() == [1.0]


def test_each_half_must_show_the_period_where_it_holds_enough_iterations() -> None:
    rng = np.random.default_rng(2)
    steady = signals.square(1800, 30, rng, duty=0.6)
    drifting = np.concatenate(
        [signals.square(900, 20, rng, duty=0.6), signals.square(900, 30, rng, duty=0.6)]
    )
    long_loop = signals.square(1800, 400, rng, duty=0.6)
    halves = half_periods(np.stack([steady, drifting, long_loop]), np.array([30.0, 60.0, 400.0]))

    assert halves.checked.tolist() == [True, True, False]  # 900 s hold < 4 x 400 s
    assert abs(halves.first[0] - 30) < 1
    assert abs(halves.second[0] - 30) < 1
    assert abs(halves.first[1] - 20) < 1
    assert abs(halves.second[1] - 30) < 1
    assert halves.agrees(np.array([30.0, 60.0, 400.0])).tolist() == [True, False, True]
    assert MIN_HALF_ITERATIONS * 30 <= 900


def test_a_drifting_period_is_no_iteration_period() -> None:
    rng = np.random.default_rng(3)
    drifting = np.concatenate(
        [signals.square(900, 20, rng, duty=0.6), signals.square(900, 30, rng, duty=0.6)]
    )
    [result] = classify_matrix(drifting[None], 1.0)
    assert (result.job_type, result.basis) == (JobType.INFERENCE, Basis.CADENCE)
    assert "period drifts: 20s then 30s" in result.reasons


def test_never_computing_flat_out_is_judged_on_the_jobs_busiest_gpu() -> None:
    """A job at 25-30 % everywhere never computes flat out; a rank at 30 % beside one at 95 %
    (rank 0 stalled most of the window) does; a lone GPU is never judged by its level (a burst
    shorter than a sample reads half its level)."""
    groups = np.array([0, 0, 1, 1, -1, 2])
    peaks = np.array([30.0, 28.0, 30.0, 95.0, 35.0, 45.0])
    busy = np.ones(6, dtype=bool)
    low, peak, shared = never_computes(groups, busy, peaks, np.full(6, np.nan))
    assert low.tolist() == [True, True, False, False, False, False]
    assert peak.tolist() == [30.0, 30.0, 95.0, 95.0, 35.0, 45.0]
    assert shared.tolist() == [True, True, True, True, False, False]
    # Power against the range overrules: a GPU drawing 70 % of its range computes.
    low, _, _ = never_computes(groups, busy, peaks, np.array([0.7, 0.2, 0.1, 0.1, 0.2, 0.1]))
    assert not low.any()


def test_a_loop_without_context_says_so_and_weighs_less() -> None:
    rng = np.random.default_rng(4)
    [result] = classify_matrix(signals.square(600, 20, rng, duty=0.6)[None], 1.0)
    assert result.reasons == ("period 20s in util", "no workload context")
    assert result.confidence < 0.55 + 0.4 * 1.0 - 0.05


def test_a_half_whose_peak_is_blurred_but_still_repeats_agrees() -> None:
    """An exporter restart read through Prometheus' lookback holds the old series' last value
    for minutes: most of one half reads a flat 94 %. That half's own search finds no period,
    but it still repeats at the window's: the loop stays an iteration loop. A half that does
    not repeat at all (the loop stops) is held against it."""
    rng = np.random.default_rng(11)
    loop = signals.square(180, 12, rng, duty=0.6, noise=3.0)
    loop[95:145] = 94.0
    stopped = loop.copy()
    stopped[90:] = rng.normal(94.0, 2.0, 90)
    halves = half_periods(np.stack([loop, stopped]), np.array([12.0, 12.0]))
    assert np.isnan(halves.second).tolist() == [True, True]
    assert halves.second_repeats.tolist() == [True, False]
    assert halves.agrees(np.array([12.0, 12.0])).tolist() == [True, False]
    [result] = classify_matrix(loop[None], 10.0)
    assert (result.job_type, result.basis) == (JobType.TRAINING, Basis.UTIL_LOOP)
