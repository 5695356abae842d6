"""GPU workload analysis: pure, vectorised functions from utilisation samples to job types.

Input is a matrix, one row per GPU and one column per sample (percent, 0-100; NaN for a
missed scrape), ``step_seconds`` apart, and optionally a ``Context``: power draw with each
GPU's range, SM activity, which rows are one job, and a prior from each workload (its owner or
the engine it runs).
``classify_matrix`` returns one ``Classification`` per row (job type, period, confidence,
reasons); ``field_stats`` summarises rows of any other field. No I/O, numpy only, and no
Python loop per series or per lag: every step works on the whole matrix (or the rows a step
concerns).

Rules, the first that applies wins (``basis.Basis``; constants live in the modules named;
docs/analysis.md has the reasoning and the measured accuracy):

1. **idle** (``classify``): a single valid sample, or at most ``MAX_IDLE_ACTIVE_FRACTION``
   (1 %) of them, reach ``IDLE_THRESHOLD_PERCENT`` (5 %, ``stats``), and those add up to less
   than ``MAX_IDLE_WORK_SECONDS`` (one GPU-second) of work above the threshold: noise is idle,
   a job that kept the GPU busy for seconds is not. A row whose samples are all missing is
   idle with NaN statistics. Nothing below ever makes an idle GPU busy.
2. **training, loop in utilisation** (``periodicity``): the row repeats an iteration loop. Gaps
   are filled by linear interpolation, the row's level and linear trend are removed, and the
   normalised autocorrelation of every row is computed at once from the zero-padded FFT power
   spectrum (the biased estimate: long lags, backed by fewer sample pairs, count for less).
   The period is the earliest autocorrelation peak between ``MIN_PERIOD_SAMPLES`` (4) and a
   third of the window that is at least ``MIN_PEAK`` high, rises ``MIN_PROMINENCE`` above the
   lowest autocorrelation at shorter lags, and reaches ``HARMONIC_RATIO`` of the highest such
   peak; the next iteration must confirm it near twice the period. A period between two whole
   samples is searched again on a finer lag grid. A periodic row idle at least
   ``MIN_BURSTY_IDLE_FRACTION`` of the time must be busy in every iteration (``recurrence``).
   A loop is evidence, not proof (``iteration``): it counts only if it pauses in most
   iterations, shows its period in both halves of the window, and its job (where it has
   several GPUs) computes flat out; and in a serving workload only if its job's ranks also
   wait in collectives.
3. **training, loop in power** (``evidence``): where utilisation is flat (standard deviation at
   most ``MAX_FLAT_UTIL_STD``), the same search runs on power (else SM activity) when it swings
   by at least ``MIN_SIGNAL_SWING`` of the GPU's power range: a data-parallel rank reads a flat
   90-100 % while its power drops at every checkpoint.
4. **training, waiting** (``evidence``): at least ``MIN_WAITING_SECONDS`` of sustained runs of
   utilisation at or above 90 % while power is within ``MAX_WAITING_POWER_FRACTION`` of the
   GPU's range above its idle floor (``power``), or SM activity at most
   ``MAX_WAITING_SM_ACTIVE``, or (where power cannot judge the sample) utilisation pinned at
   ``MIN_PINNED_UTIL`` while a coupled GPU of the same job is stalled: a kernel resident but
   not computing, a rank waiting in a collective. Not in a serving workload.
5. **training, sibling**: another busy GPU of the same job has a loop or waits; the row keeps
   its own statistics and takes the sibling's period. A job is ``Context.groups`` (a pod or
   workload); GPUs of no known job on one node (``Context.nodes``) are one job when their
   stalls coincide (``coupling``), never just because they share the node.
6. **training, owner**: the workload is a training one (``Context.priors``).
7. **bursty**: idle for at least ``MIN_BURSTY_IDLE_FRACTION`` (30 %) of the samples.
8. **inference, cadence**: a loop of its own that did not count: requests at a rhythm.
9. **inference**: anything else: sustained activity without a loop.

With no workload known, a verdict on a loop (kept or not) says ``no workload context`` and
weighs less.

Windows shorter than 12 samples cannot hold three iterations of four samples, so they never
show a loop.
"""

from profiler_app.analysis.basis import Basis, JobType
from profiler_app.analysis.classify import (
    MAX_IDLE_ACTIVE_FRACTION,
    MAX_IDLE_WORK_SECONDS,
    Classification,
    classify_matrix,
)
from profiler_app.analysis.context import Context
from profiler_app.analysis.power import model_power, power_range
from profiler_app.analysis.recurrence import MAX_IDLE_ITERATION_FRACTION, MIN_BURSTY_IDLE_FRACTION
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
    "classify_matrix",
    "field_stats",
    "model_power",
    "power_range",
]
