"""Throughput of one trial from what it leaves behind: pure functions, no I/O.

In order of preference (docs/trial.md explains each and its limits):

1. ``metric``: a rate the user's job reports, as a PromQL expression over the trial's pods or as
   ``name=value`` lines on stdout in Katib's format; its samples are the throughput.
2. ``step-regex``: the time between log lines that match a regular expression (one a step).
3. ``period``: the profiler's own iteration period of the trial's GPUs (autocorrelation of GPU
   utilisation, ``analysis.periodicity``). Valid only when the period is at least twice the
   sampling step and the measured part holds at least three iterations.
4. ``sm-proxy``: mean SM activity times GPUs. A proxy, labelled so: utilisation is not throughput.

Samples before the end of the warm-up are discarded by the caller (``after``). A measurement is
stable once the coefficient of variation of its last samples (at least ``MIN_STABLE_SAMPLES``)
is under ``STABLE_CV``: the trial may end early.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

from profiler_app.analysis.periodicity import find_periods

METRIC, STEP_REGEX, PERIOD, SM_PROXY = "metric", "step-regex", "period", "sm-proxy"
ESTIMATORS = (METRIC, STEP_REGEX, PERIOD, SM_PROXY)
# Katib's StdOut collector filter (katib pkg/metricscollector/v1beta1/common DefaultFilter).
KATIB_FILTER = re.compile(r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)")
STABLE_CV = 0.05
MIN_STABLE_SAMPLES = 5
STABILITY_WINDOW = 50  # the most recent samples the stability test looks at
MIN_PERIOD_STEPS = 2.0  # the period must span at least this many sampling steps
MIN_ITERATIONS = 3.0  # the measured part must hold at least this many iterations

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Measurement:
    """What one estimator made of a trial. ``rate`` is per second in ``unit`` (steps/s for the
    step-based estimators, whose ``step_seconds`` is set); None with ``note`` saying why."""

    estimator: str
    rate: float | None
    unit: str
    samples: int = 0
    step_seconds: float | None = None
    cv: float | None = None
    relative_error: float | None = None  # standard error of the rate, relative
    stable: bool = False
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.rate is not None and self.rate > 0


def unmeasured(estimator: str, note: str, unit: str = "") -> Measurement:
    return Measurement(estimator, None, unit, note=note)


def parse_log(text: str) -> list[tuple[float, str]]:
    """``(unix seconds, line)`` of a log fetched with ``timestamps=true`` (each line starts with
    an RFC 3339 time, nanoseconds included); lines without one are skipped."""
    parsed = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        seconds = _rfc3339_seconds(stamp)
        if seconds is not None:
            parsed.append((seconds, rest))
    return parsed


def _rfc3339_seconds(stamp: str) -> float | None:
    """Seconds of an RFC 3339 time; fractions past microseconds are kept in the float."""
    if not stamp.endswith("Z") or "T" not in stamp:
        return None
    whole, _, fraction = stamp[:-1].partition(".")
    try:
        moment = datetime.fromisoformat(whole + "+00:00")
    except ValueError:
        return None
    if fraction and not fraction.isdigit():
        return None
    return moment.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


def after(points: Sequence[tuple[float, str]], start: float) -> list[tuple[float, str]]:
    """The points at or after ``start`` (the end of the warm-up)."""
    return [point for point in points if point[0] >= start]


def katib_samples(lines: Sequence[tuple[float, str]], name: str) -> tuple[FloatArray, FloatArray]:
    """Times and values of metric ``name`` in ``name=value`` lines (Katib's format)."""
    times, values = [], []
    for moment, text in lines:
        for match in KATIB_FILTER.finditer(text):
            if match.group(1) == name:
                try:
                    value = float(match.group(2))
                except ValueError:
                    continue
                times.append(moment)
                values.append(value)
    return np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64)


def step_marks(lines: Sequence[tuple[float, str]], pattern: re.Pattern[str]) -> FloatArray:
    """Times of the lines that mark a step."""
    return np.asarray([moment for moment, text in lines if pattern.search(text)], dtype=np.float64)


def coefficient_of_variation(values: FloatArray) -> float | None:
    if values.size < 2:
        return None
    mean = float(np.mean(values))
    return float(np.std(values, ddof=1) / mean) if mean > 0 else None


def is_stable(values: FloatArray) -> tuple[bool, float | None]:
    """Whether the last samples vary less than ``STABLE_CV``, and their coefficient."""
    recent = values[-STABILITY_WINDOW:]
    cv = coefficient_of_variation(recent)
    return recent.size >= MIN_STABLE_SAMPLES and cv is not None and cv < STABLE_CV, cv


def _relative_error(values: FloatArray) -> float | None:
    cv = coefficient_of_variation(values)
    return None if cv is None else cv / math.sqrt(values.size)


def from_rate_samples(values: FloatArray, unit: str) -> Measurement:
    """Estimator 1: samples of a rate the job reports (PromQL or Katib lines), after warm-up."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return unmeasured(METRIC, f"no sample of {unit} after the warm-up", unit)
    stable, cv = is_stable(finite)
    return Measurement(
        METRIC,
        float(np.mean(finite)),
        unit,
        samples=int(finite.size),
        cv=cv,
        relative_error=_relative_error(finite),
        stable=stable,
    )


def from_step_marks(marks: FloatArray) -> Measurement:
    """Estimator 2: steps per second from the times of step lines, after warm-up."""
    if marks.size < 2:
        return unmeasured(
            STEP_REGEX, f"{marks.size} step line(s) after the warm-up: need two", "steps/s"
        )
    intervals = np.diff(np.sort(marks))
    intervals = intervals[intervals > 0]
    if intervals.size == 0:
        return unmeasured(STEP_REGEX, "every step line has the same time", "steps/s")
    step = float(np.mean(intervals))
    stable, cv = is_stable(intervals)
    return Measurement(
        STEP_REGEX,
        1.0 / step,
        "steps/s",
        samples=int(intervals.size),
        step_seconds=step,
        cv=cv,
        relative_error=_relative_error(intervals),
        stable=stable,
    )


def from_waveform(utilisation: FloatArray, step_seconds: float) -> Measurement:
    """Estimator 3: the iteration period of the trial's GPUs (rows: GPUs, columns: samples
    ``step_seconds`` apart, after warm-up), the median over GPUs that show one."""
    matrix = np.atleast_2d(np.asarray(utilisation, dtype=np.float64))
    duration = matrix.shape[1] * step_seconds
    if matrix.size == 0:
        return unmeasured(PERIOD, "no GPU utilisation samples after the warm-up", "steps/s")
    # The detector itself keeps to the rule: a period of at least MIN_PERIOD_SAMPLES (4) samples
    # and at most a third of the window (tests hold it to MIN_PERIOD_STEPS and MIN_ITERATIONS).
    periods, _strength = find_periods(matrix)
    found = periods[np.isfinite(periods)] * step_seconds
    if found.size == 0:
        return unmeasured(
            PERIOD,
            f"cannot measure: no iteration period of at least two sampling steps with three "
            f"iterations in {duration:.0f} s of GPU utilisation sampled every {step_seconds:g} s",
            "steps/s",
        )
    period = float(np.median(found))
    return Measurement(
        PERIOD,
        1.0 / period,
        "steps/s",
        samples=int(found.size),
        step_seconds=period,
        # The span of the iterations is known to half a sample.
        relative_error=0.5 * step_seconds / duration,
        note=f"period {period:.2f} s from {found.size} GPU(s)",
    )


def from_sm_activity(sm_active: FloatArray, gpus: int) -> Measurement:
    """Estimator 4: mean SM activity (0-1) times GPUs, a proxy for throughput."""
    finite = np.asarray(sm_active, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    unit = "SM-active GPUs (proxy)"
    if finite.size == 0:
        return unmeasured(SM_PROXY, "no SM activity samples after the warm-up", unit)
    return Measurement(
        SM_PROXY,
        float(np.mean(finite)) * gpus,
        unit,
        samples=int(finite.size),
        relative_error=_relative_error(finite),
        note="a proxy: SM activity is not throughput",
    )
