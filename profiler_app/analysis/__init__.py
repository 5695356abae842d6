"""GPU workload analysis: pure, vectorised functions from utilisation samples to job types.

Input is a matrix, one row per GPU and one column per sample (percent, 0-100; NaN for a
missed scrape), ``step_seconds`` apart. ``classify_matrix`` returns one ``Classification``
per row; ``field_stats`` summarises rows of any other field. No I/O, numpy only, and no
Python loop per series or per lag: every step works on the whole matrix.

Rules, applied in this order (constants live in the modules named; docs/analysis.md has the
reasoning and the measured accuracy):

1. **idle** (``classify``): a single valid sample, or at most ``MAX_IDLE_ACTIVE_FRACTION``
   (1 %) of them, reach ``IDLE_THRESHOLD_PERCENT`` (5 %, ``stats``). A few percent of
   noise, or one blip, is idle. A row whose samples are all missing is idle with NaN
   statistics: nothing ran that we could see, and an "unknown" type would force every
   consumer to handle a fifth case.
2. **training** (``periodicity``): the row repeats an iteration loop. Gaps are filled by
   linear interpolation, the row's level and linear trend are removed, and the normalised
   autocorrelation of every row is computed at once from the zero-padded FFT power
   spectrum (the biased estimate: long lags, backed by fewer sample pairs, count for
   less). The period is the earliest autocorrelation peak between ``MIN_PERIOD_SAMPLES``
   (4) and a third of the window that is at least ``MIN_PEAK`` high, rises
   ``MIN_PROMINENCE`` above the lowest autocorrelation at shorter lags (a random walk's
   slowly decaying autocorrelation has no such dip and rise), and reaches
   ``HARMONIC_RATIO`` of the highest such peak (so the fundamental wins over its
   multiples). The next iteration must confirm it: the autocorrelation within 10 % of twice
   the period reaches ``MIN_CONFIRMATION``. A parabola through the peak and its neighbours
   refines the period to a fraction of a sample. A period between two whole samples (12.5)
   repeats exactly only at a multiple (25), whose peak can read higher than the sampled
   peak at 12 or 13: rows with a local peak near a half to a fifth of their period are
   searched again on a 4x finer, band-limited lag grid of the lightly smoothed signal, where
   the fundamental wins if it reaches ``FINE_HARMONIC_RATIO`` of the best. Finally
   (``recurrence``), a periodic row that is idle at least ``MIN_BURSTY_IDLE_FRACTION`` of
   the time must be busy in every iteration: at most ``MAX_IDLE_ITERATION_FRACTION`` (15 %)
   of the windows one period long may lack a busy sample (half the row's p95), which leaves
   room for an evaluation pause but not for a few bursts that happen to be spaced alike.
3. **bursty** (``classify``): not periodic, and idle for at least
   ``MIN_BURSTY_IDLE_FRACTION`` (30 %) of the samples: sporadic bursts separated by idle
   stretches.
4. **inference**: anything else: sustained, non-periodic activity.

Windows shorter than 12 samples cannot hold three iterations of four samples, so they are
never training.
"""

from profiler_app.analysis.basis import Basis, JobType
from profiler_app.analysis.classify import (
    MAX_IDLE_ACTIVE_FRACTION,
    MAX_IDLE_ITERATION_FRACTION,
    MAX_IDLE_WORK_SECONDS,
    MIN_BURSTY_IDLE_FRACTION,
    Classification,
    classify_matrix,
)
from profiler_app.analysis.context import Context, Prior
from profiler_app.analysis.power import model_power, power_range
from profiler_app.analysis.stats import IDLE_THRESHOLD_PERCENT, field_stats

__all__ = [
    "IDLE_THRESHOLD_PERCENT",
    "MAX_IDLE_ACTIVE_FRACTION",
    "MAX_IDLE_ITERATION_FRACTION",
    "MAX_IDLE_WORK_SECONDS",
    "MIN_BURSTY_IDLE_FRACTION",
    "Basis",
    "Classification",
    "Context",
    "JobType",
    "Prior",
    "classify_matrix",
    "field_stats",
    "model_power",
    "power_range",
]
