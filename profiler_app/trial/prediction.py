"""A trial the step-time model predicts with confidence from the trials measured so far, as a
measurement, so that the run need not start it."""

from __future__ import annotations

from collections.abc import Collection

from profiler_app.trial import estimators
from profiler_app.trial.estimators import Measurement
from profiler_app.trial.manifests import STRONG, BatchScaling
from profiler_app.trial.model import Point, confident_prediction
from profiler_app.trial.plan import PlannedTrial
from profiler_app.trial.results import OK, TrialResult


def predicted_measurement(
    trial: PlannedTrial,
    results: Collection[TrialResult],
    scaling: BatchScaling,
    tolerance: float,
) -> Measurement | None:
    """The model's confident prediction for ``trial``, as a measurement in the units of the
    estimator the trials so far were compared by; None when it is not confident."""
    estimator = _compared_estimator(results)
    strong = scaling.scale == STRONG
    points = [
        Point(r.placement.gpus, r.nodes_used, step, r.measurement.relative_error or 0.0)
        for r in results
        if r.status == OK
        and r.measurement is not None
        and r.measurement.estimator == estimator
        and r.placement.model == trial.placement.model
        and (step := _step_time(r.measurement, r.placement.gpus, strong)) is not None
    ]
    predicted = confident_prediction(
        points,
        trial.placement.gpus,
        trial.nodes_used,
        strong=strong,
        tolerance=tolerance,
    )
    if predicted is None:
        return None
    step = predicted.step_seconds
    error = predicted.relative_halfwidth / 1.96
    if estimator == estimators.METRIC:  # back into the job's own rate
        work = 1.0 if strong else float(trial.placement.gpus)
        unit = next(
            r.measurement.unit
            for r in results
            if r.measurement is not None and r.measurement.estimator == estimator
        )
        return Measurement(
            estimator, work / step, unit, relative_error=error, note=predicted.describe()
        )
    return Measurement(
        estimator,
        1.0 / step,
        "steps/s",
        step_seconds=step,
        relative_error=error,
        note=predicted.describe(),
    )


def _compared_estimator(results: Collection[TrialResult]) -> str:
    """The most preferred estimator the model may use that measured a trial."""
    used = [
        r.measurement.estimator
        for r in results
        if r.status == OK
        and r.measurement is not None
        and r.measurement.estimator != estimators.SM_PROXY
    ]
    return min(used, key=estimators.ESTIMATORS.index) if used else estimators.STEP_REGEX


def _step_time(measurement: Measurement, gpus: int, strong: bool) -> float | None:
    """Seconds a step: measured, or from a reported rate of work (weak scaling: a step does
    one batch per GPU)."""
    if measurement.step_seconds is not None:
        return measurement.step_seconds
    if measurement.rate is None or measurement.rate <= 0:
        return None
    return (1.0 if strong else float(gpus)) / measurement.rate
