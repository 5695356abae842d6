"""Job type of each GPU from its utilisation samples and whatever else is known about it: the
rules applied to the whole matrix, with a confidence and the evidence behind each verdict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from profiler_app.analysis import coupling, evidence, iteration
from profiler_app.analysis.basis import Basis, JobType
from profiler_app.analysis.context import Context
from profiler_app.analysis.periodicity import find_periods
from profiler_app.analysis.reasons import all_reasons
from profiler_app.analysis.recurrence import (
    MIN_BURSTY_IDLE_FRACTION,
    drop_irregular,
)
from profiler_app.analysis.stats import BoolArray, FloatArray, Summary, as_matrix, summarise
from profiler_app.core.model import FieldStats

# A GPU busy (at or above IDLE_THRESHOLD_PERCENT) in a single sample, or in at most this
# fraction of its samples, is idle, provided those samples add up to less than
# MAX_IDLE_WORK_SECONDS of work above the threshold: a few percent of noise is not a workload,
# but a job that kept the GPU busy for seconds is one, however short.
MAX_IDLE_ACTIVE_FRACTION = 0.01
MAX_IDLE_WORK_SECONDS = 1.0


_PRIOR_TRAINING, _PRIOR_SERVING = 1, 2


@dataclass(frozen=True)
class Classification:
    """What one row of the matrix shows, how sure the rules are, and why."""

    job_type: JobType
    period_seconds: float | None  # training whose loop is visible (its own or a sibling's)
    stats: FieldStats
    confidence: float = 1.0  # 0-1, a documented heuristic score, not a calibrated probability
    reasons: tuple[str, ...] = ()  # machine-readable evidence, e.g. "period 80s in power"
    basis: Basis = Basis.STEADY


def _idle(summary: Summary, step_seconds: float) -> BoolArray:
    allowed_active = np.maximum(1, MAX_IDLE_ACTIVE_FRACTION * summary.valid_count)
    work_seconds = summary.excess * step_seconds / 100.0
    idle: BoolArray = (summary.active_count <= allowed_active) & (
        work_seconds < MAX_IDLE_WORK_SECONDS
    )
    return idle


def _util_loops(matrix: np.ndarray, summary: Summary) -> tuple[FloatArray, FloatArray]:
    """Utilisation periods (samples) and strengths; sparse loops must recur every iteration."""
    periods, strength = find_periods(matrix)
    drop_irregular(matrix, summary.idle_fraction, summary.p95, periods, strength)
    return periods, strength


def classify_matrix(
    values: object, step_seconds: float, context: Context | None = None
) -> list[Classification]:
    """Classify each row (one GPU's utilisation in percent, NaN for missed samples).

    ``values`` is a 2-D array-like, one row per GPU, samples ``step_seconds`` apart;
    ``context`` adds what else is known per row (power, SM activity, jobs, priors).
    Returns one ``Classification`` per row, in order. See the package docstring for the rules.
    """
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds!r}")
    matrix = as_matrix(values)
    rows, columns = matrix.shape
    context = (context or Context()).checked(rows, columns)
    summary = summarise(matrix)
    idle = _idle(summary, step_seconds)
    util_period, util_strength = _util_loops(matrix, summary)
    util_loop = np.isfinite(util_period) & ~idle
    loops = evidence.signal_loops(matrix, summary, ~idle & ~util_loop, context)
    signal_loop = np.isfinite(loops.period)
    coupled = coupling.coupled_pairs(matrix, ~idle, context, summary.valid_count)
    groups = coupling.join(context.groups, coupled, rows)
    waits = evidence.waiting(
        matrix,
        ~idle,
        context,
        step_seconds,
        coupling=coupled,
        groups=groups,
        steady=summary.idle_fraction < MIN_BURSTY_IDLE_FRACTION,
    )
    priors = context.prior_codes(rows)
    serving = priors == _PRIOR_SERVING
    waiting = waits.evident & ~idle & ~serving
    looped = util_loop | signal_loop
    review = iteration.review(
        matrix,
        summary,
        context,
        looped=looped,
        in_util=util_loop,
        period=np.where(util_loop, util_period, loops.period),
        signal_names=[
            "util" if found else name
            for found, name in zip(util_loop.tolist(), loops.signal, strict=True)
        ],
        groups=groups,
        busy=~idle,
        waiting=waits.evident & ~idle,
        serving=serving,
    )
    accepted = review.accepted
    util_loop &= accepted
    signal_loop &= accepted

    own_period = review.period
    own_strength = np.where(util_loop, util_strength, loops.strength)
    own_confidence = np.select(
        [util_loop, signal_loop, waiting],
        [
            0.55 + 0.4 * own_strength,
            0.5 + 0.4 * own_strength,
            0.55 + 0.3 * np.minimum(1.0, waits.share / 0.5),
        ],
        default=0.0,
    )
    own_evidence = util_loop | signal_loop | waiting
    sibling = evidence.siblings(groups, own_evidence, own_confidence).source
    from_sibling = ~idle & ~own_evidence & (sibling >= 0)

    basis = np.select(
        [
            idle,
            util_loop,
            signal_loop,
            waiting,
            from_sibling,
            ~idle & (priors == _PRIOR_TRAINING),
            summary.idle_fraction >= MIN_BURSTY_IDLE_FRACTION,
            looped & ~accepted,
        ],
        [
            Basis.IDLE,
            Basis.UTIL_LOOP,
            Basis.SIGNAL_LOOP,
            Basis.WAITING,
            Basis.SIBLING,
            Basis.PRIOR,
            Basis.BURSTY,
            Basis.CADENCE,
        ],
        default=Basis.STEADY,
    )
    source = np.where(from_sibling, sibling, np.arange(rows))
    period = np.where(basis <= Basis.SIBLING, own_period[source], np.nan)
    # With no workload known, a verdict on a loop guesses between training iterations and a
    # request cadence; a job whose ranks wait in collectives is no guess.
    raw_waits = waits.evident & ~idle
    no_context = (priors == 0) & ~(raw_waits | iteration.job_any(groups, raw_waits))
    guess = no_context & rests_on_loop(basis)
    confidence = _confidence(basis, summary, own_confidence, source, priors=priors, guess=guess)
    seconds = period * step_seconds
    reasons = all_reasons(
        basis,
        seconds,
        summary=summary,
        loops=loops,
        waits=waits,
        review=review,
        step_seconds=step_seconds,
        source=source,
        context=context,
        coupled_with=_coupled_with(context.groups, coupled, rows),
        guess=guess,
    )
    results = []
    for code, row_seconds, row_confidence, row_stats, row_reasons in zip(
        basis.tolist(),
        seconds.tolist(),
        confidence.tolist(),
        summary.field_stats(),
        reasons,
        strict=True,
    ):
        kind = Basis(code)
        job_type = kind.job_type
        results.append(
            Classification(
                job_type,
                row_seconds if job_type is JobType.TRAINING and np.isfinite(row_seconds) else None,
                row_stats,
                round(row_confidence, 2),
                row_reasons,
                kind,
            )
        )
    return results


def _coupled_with(known: np.ndarray | None, coupled: coupling.Coupling, rows: int) -> np.ndarray:
    """For rows of no known job grouped by coupled stalls: the partner that grouped them."""
    partner = coupled.partners(rows)
    if known is not None:
        partner[np.asarray(known) >= 0] = -1
    return partner


def _confidence(
    basis: np.ndarray,
    summary: Summary,
    own: FloatArray,
    source: np.ndarray,
    *,
    priors: np.ndarray,
    guess: BoolArray,
) -> FloatArray:
    """Heuristic confidence per row (docs/analysis.md has the table)."""
    base = np.select(
        [
            basis == Basis.IDLE,
            basis <= Basis.WAITING,
            basis == Basis.SIBLING,
            basis == Basis.PRIOR,
            basis == Basis.BURSTY,
        ],
        [
            np.where(summary.active_count == 0, 0.95, 0.8),
            own,
            0.9 * own[source],
            0.6,
            0.75,
        ],
        default=0.6,  # a cadence, steady load
    )
    training = (basis >= Basis.UTIL_LOOP) & (basis <= Basis.PRIOR)
    serving = basis >= Basis.BURSTY
    # A workload that agrees adds confidence, one that disagrees takes some away (only a loop
    # with waiting ranks wins over a serving workload); a guess (``guess``) takes some away.
    agrees = (training & (priors == _PRIOR_TRAINING) & (basis != Basis.PRIOR)) | (
        serving & (priors == _PRIOR_SERVING)
    )
    disagrees = training & (priors == _PRIOR_SERVING)
    adjusted: FloatArray = np.clip(base + 0.1 * agrees - 0.15 * disagrees - 0.1 * guess, 0.05, 0.99)
    return adjusted


def rests_on_loop(basis: np.ndarray) -> BoolArray:
    """Verdicts that rest on a loop, taken for training (its own or a sibling's) or not."""
    found: BoolArray = np.isin(
        basis, (Basis.UTIL_LOOP, Basis.SIGNAL_LOOP, Basis.SIBLING, Basis.CADENCE)
    )
    return found
