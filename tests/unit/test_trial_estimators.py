"""The throughput estimators on generated logs, metric samples and waveforms, the warm-up, the
stability rule, the fitted step-time model, and the results (efficiency, Pareto front,
recommendation)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from profiler_app.analysis import periodicity
from profiler_app.trial import estimators
from profiler_app.trial.estimators import (
    from_rate_samples,
    from_sm_activity,
    from_step_marks,
    from_waveform,
    katib_samples,
    parse_log,
    step_marks,
)
from profiler_app.trial.model import Point, confident_prediction, features, fit_points
from profiler_app.trial.placement import Placement
from profiler_app.trial.results import OK, PREDICTED, TrialResult, pareto_front, summarise
from tests.support.clock import rfc3339_nano

START = 1_790_000_000.0


def log_text(times: np.ndarray, line: str = "step={n} loss=0.5 samples_per_sec={rate}") -> str:
    rate = 1.0 / float(np.mean(np.diff(times))) if times.size > 1 else 0
    return (
        "".join(
            f"{rfc3339_nano(t)} {line.format(n=n, rate=f'{rate * 32:.2f}')}\n"
            for n, t in enumerate(times)
        )
        + "a line without a timestamp\n"
    )


def steps(period: float, count: int, jitter: float = 0.0, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return START + np.cumsum(period * (1 + rng.uniform(-jitter, jitter, count)))


def test_log_timestamps_keep_their_nanoseconds() -> None:
    ((moment, line),) = parse_log("2026-11-26T10:00:00.123456789Z step=1\n")
    assert line == "step=1"
    assert moment == pytest.approx(1795687200.123456789, abs=1e-6)
    assert parse_log("not a log line\n2026-13-40T00:00:00Z x\n") == []


def test_step_regex_gives_steps_per_second_after_the_warm_up() -> None:
    times = np.concatenate([steps(2.0, 10), steps(0.5, 40)[:] + 20.0])  # slow warm-up, then 2/s
    lines = parse_log(log_text(times))
    measured = from_step_marks(
        step_marks(estimators.after(lines, START + 21.0), re.compile(r"^step="))
    )
    assert measured.ok
    assert measured.estimator == "step-regex"
    assert measured.step_seconds == pytest.approx(0.5)
    assert measured.rate == pytest.approx(2.0)
    everything = from_step_marks(step_marks(lines, re.compile(r"^step=")))
    assert everything.rate is not None
    assert everything.rate < 1.6
    assert not from_step_marks(np.array([START])).ok


def test_katib_lines_give_the_reported_rate() -> None:
    lines = parse_log(
        "".join(
            f"{rfc3339_nano(START + i)} epoch 1: loss=0.3 samples_per_sec={100 + i % 2}\n"
            for i in range(10)
        )
    )
    times, values = katib_samples(lines, "samples_per_sec")
    assert times.size == 10
    assert values.mean() == pytest.approx(100.5)
    measured = from_rate_samples(values, "samples_per_sec")
    assert measured.estimator == "metric"
    assert measured.rate == pytest.approx(100.5)
    assert measured.stable  # CV 0.5 % over 10 samples
    assert katib_samples(lines, "accuracy")[1].size == 0
    assert not from_rate_samples(np.array([np.nan]), "x").ok


def test_stability_needs_five_samples_under_five_percent() -> None:
    assert not estimators.is_stable(np.array([1.0, 1.0, 1.0, 1.0]))[0]
    assert estimators.is_stable(np.array([1.0, 1.01, 0.99, 1.0, 1.02]))[0]
    stable, cv = estimators.is_stable(np.array([1.0, 1.3, 0.8, 1.1, 0.9, 1.2]))
    assert not stable
    assert cv is not None
    assert cv > 0.05
    assert from_step_marks(steps(0.5, 30, jitter=0.02)).stable
    assert not from_step_marks(steps(0.5, 30, jitter=0.4)).stable


def square_wave(period_samples: float, samples: int, gpus: int = 2, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    phase = (np.arange(samples) % period_samples) / period_samples
    wave = np.where(phase < 0.6, 95.0, 15.0)
    return np.vstack([wave + rng.normal(0, 2, samples) for _ in range(gpus)])


def test_the_period_estimator_reads_the_iteration_period() -> None:
    measured = from_waveform(square_wave(6, 60), step_seconds=10.0)
    assert measured.ok
    assert measured.estimator == "period"
    assert measured.step_seconds == pytest.approx(60.0, rel=0.02)
    assert measured.relative_error == pytest.approx(0.5 * 10 / 600)


def test_the_period_estimator_says_when_it_cannot_measure() -> None:
    short = from_waveform(square_wave(8, 20), step_seconds=10.0)  # 2.5 iterations
    assert not short.ok
    assert short.note.startswith("cannot measure: no iteration period of at least two sampling")
    flat = from_waveform(np.full((2, 60), 90.0), step_seconds=10.0)
    assert not flat.ok
    assert "cannot measure" in flat.note


def test_the_validity_rule_is_the_detectors_own() -> None:
    """At least two sampling steps a period and three iterations measured: the detector finds
    no period outside those bounds (a change there must keep them)."""
    assert periodicity.MIN_PERIOD_SAMPLES >= estimators.MIN_PERIOD_STEPS
    assert periodicity.MAX_PERIOD_FRACTION <= 1 / estimators.MIN_ITERATIONS
    found = from_waveform(square_wave(4, 60), step_seconds=10.0)
    assert found.ok
    assert found.step_seconds == pytest.approx(40.0, rel=0.02)


def test_sm_activity_is_a_labelled_proxy() -> None:
    measured = from_sm_activity(np.array([0.8, 0.7, np.nan]), gpus=4)
    assert measured.rate == pytest.approx(3.0)
    assert "proxy" in measured.unit
    assert "not throughput" in measured.note


# -- the fitted model ------------------------------------------------------------------------


def truth(gpus: int, nodes: int) -> float:
    return 0.2 + (gpus - 1) / gpus * (0.02 if nodes == 1 else 0.3)


def test_features_follow_compute_and_ring_all_reduce() -> None:
    assert features(1, 1, strong=False).tolist() == [1.0, 0.0, 0.0]
    assert features(4, 2, strong=False).tolist() == [1.0, 0.0, 0.75]
    assert features(4, 1, strong=True).tolist() == [0.25, 1.0, 0.75, 0.0]


def test_the_model_recovers_its_parameters() -> None:
    points = [Point(k, n, truth(k, n), 0.01) for k, n in ((1, 1), (2, 1), (2, 2), (4, 1))]
    model = fit_points(points, strong=False)
    assert model.coefficients == pytest.approx([0.2, 0.02, 0.3], abs=1e-9)


def test_three_points_fit_but_predict_nothing_unvalidated() -> None:
    points = [Point(k, n, truth(k, n), 0.01) for k, n in ((1, 1), (2, 1), (2, 2))]
    assert confident_prediction(points, 4, 1) is None  # nothing checked the model yet


def test_a_validated_model_predicts_what_it_determines() -> None:
    points = [
        Point(k, n, truth(k, n) * (1 + e), 0.01)
        for (k, n), e in zip(
            ((1, 1), (2, 1), (2, 2), (4, 1)), (0.0, 0.004, -0.003, 0.002), strict=True
        )
    ]
    predicted = confident_prediction(points, 4, 2)
    assert predicted is not None
    assert predicted.step_seconds == pytest.approx(truth(4, 2), rel=0.01)
    assert predicted.relative_halfwidth < 0.10
    assert "4 measured trials" in predicted.describe()
    assert confident_prediction(points, 16, 1) is None  # past twice the most GPUs measured


def test_a_model_that_misses_a_measured_point_predicts_nothing() -> None:
    points = [
        Point(1, 1, 0.2, 0.01),
        Point(2, 1, 0.21, 0.01),
        Point(2, 2, 0.35, 0.01),
        Point(4, 1, 0.40, 0.01),
    ]  # contention the model has no term for
    assert confident_prediction(points, 4, 2) is None


def test_uncertain_points_widen_the_interval_past_the_tolerance() -> None:
    """The same exact step times, measured to 1 % or to 5 %: only the first predicts."""
    for error, confident in ((0.01, True), (0.05, False)):
        points = [Point(k, n, truth(k, n), error) for k, n in ((1, 1), (2, 1), (2, 2), (4, 1))]
        assert (confident_prediction(points, 4, 2, tolerance=0.10) is not None) is confident


# -- results ---------------------------------------------------------------------------------


def result(index: int, gpus: int, layout: str, rate: float, status: str = OK) -> TrialResult:
    measured = estimators.Measurement(
        "step-regex", rate, "steps/s", samples=20, step_seconds=1 / rate
    )
    pods = 1 if layout == "packed" else gpus
    return TrialResult(
        index, f"t-{index}", Placement(gpus, gpus // pods, layout), 1, status, measurement=measured
    )


def test_weak_scaling_results_efficiency_front_and_recommendation() -> None:
    results = [
        result(0, 1, "packed", 5.0),  # 5 per-GPU batches/s
        result(1, 2, "packed", 4.7),  # 9.4
        result(2, 2, "spread", 2.9),  # 5.8
        result(3, 4, "packed", 2.5),  # 10.0
    ]
    summary = summarise(results, "weak")
    rows = {row["trial"]: row for row in summary.rows()}
    assert rows["t-1"]["throughput"] == pytest.approx(9.4)
    assert rows["t-1"]["scaling_efficiency"] == pytest.approx(0.94)
    assert rows["t-3"]["throughput_per_gpu"] == pytest.approx(2.5)
    assert [r.name for r in summary.pareto] == ["t-0", "t-1", "t-3"]
    assert rows["t-1"]["recommended"]
    assert summary.recommendation == (
        "2 GPUs packed: 94% of the best throughput (4 GPUs packed) at half the GPUs; "
        "scaling efficiency 94%"
    )


def test_the_recommendation_is_the_best_when_nothing_smaller_comes_close() -> None:
    summary = summarise([result(0, 1, "packed", 1.0), result(1, 2, "packed", 0.99)], "weak")
    assert summary.recommendation.startswith("2 GPUs packed: the best throughput, 1.98")


def test_a_predicted_trial_says_so() -> None:
    summary = summarise(
        [result(0, 1, "packed", 1.0), result(1, 2, "spread", 0.99, PREDICTED)], "weak"
    )
    assert "(predicted by the step-time model)" in summary.recommendation


def test_strong_scaling_compares_steps_per_second() -> None:
    summary = summarise([result(0, 1, "packed", 1.0), result(1, 2, "packed", 1.8)], "strong")
    rows = summary.rows()
    assert [r["throughput"] for r in rows] == [1.0, 1.8]
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.9)


def test_nothing_measured_means_nothing_recommended() -> None:
    failed = TrialResult(0, "t-0", Placement(1, 1, "packed"), 1, "failed", note="exit 1")
    summary = summarise([failed], "weak")
    assert summary.recommendation == "no trial measured a throughput: nothing to recommend"
    assert pareto_front([]) == []
