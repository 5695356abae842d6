"""Labelled GPU-utilisation signals for tests and benchmarks.

Every generator returns a 1-D float array of percentages in [0, 100] and takes a seeded
``np.random.Generator`` so data sets are reproducible. Periods and lengths are in samples
(any positive real number); ``labelled_corpus`` converts them to seconds with each window's
step. Periodic shapes are averaged over each sample interval, as dcgm-exporter's utilisation
is, rather than sampled at one instant. Shape parameters are keyword-only.

Shapes of a training loop: ``square`` (compute/communication phases), ``sawtooth`` (ramping
load), ``sine`` (smooth oscillation), ``spikes`` (a short busy burst per iteration).
Modifiers that make them realistic: ``with_jitter`` (iteration lengths vary), ``with_eval_dip``
(an evaluation pause), ``with_gaps`` (missing scrapes as NaN).
Non-periodic shapes: ``steady_serving`` and ``random_walk`` (inference), ``sporadic_bursts``
(bursty), ``near_zero_noise`` (idle).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

Signal = npt.NDArray[np.float64]

IDLE = "idle"
TRAINING = "training"
INFERENCE = "inference"
BURSTY = "bursty"


def _finish(clean: Signal, noise: float, rng: np.random.Generator) -> Signal:
    noisy = clean + rng.normal(0.0, noise, clean.size) if noise > 0 else clean
    return np.clip(noisy, 0.0, 100.0)


# Sub-samples per sample: like dcgm-exporter's utilisation (the share of the sampling interval
# a kernel ran), each sample averages the shape over its interval instead of picking one point.
_SUBSAMPLES = 8


def _sampled(
    n: int, period: float, rng: np.random.Generator, shape: Callable[[Signal], Signal]
) -> Signal:
    """``shape`` (of the position within the iteration, in [0, 1)) averaged over each sample
    interval, starting at a random point of the cycle."""
    offsets = (np.arange(_SUBSAMPLES) + 0.5) / _SUBSAMPLES
    time = np.arange(n)[:, None] + offsets
    phase = (time / period + rng.uniform(0.0, 1.0)) % 1.0
    averaged: Signal = shape(phase).mean(axis=1)
    return averaged


def square(
    n: int,
    period: float,
    rng: np.random.Generator,
    *,
    duty: float = 0.5,
    low: float = 5.0,
    high: float = 95.0,
    noise: float = 2.0,
) -> Signal:
    """Busy (``high``) for ``duty`` of each iteration, then ``low``."""
    clean = _sampled(n, period, rng, lambda phase: np.where(phase < duty, high, low))
    return _finish(clean, noise, rng)


def sawtooth(
    n: int,
    period: float,
    rng: np.random.Generator,
    *,
    low: float = 10.0,
    high: float = 90.0,
    noise: float = 2.0,
) -> Signal:
    """Load ramps from ``low`` to ``high`` over each iteration, then drops."""
    clean = _sampled(n, period, rng, lambda phase: low + (high - low) * phase)
    return _finish(clean, noise, rng)


def sine(
    n: int,
    period: float,
    rng: np.random.Generator,
    *,
    low: float = 20.0,
    high: float = 80.0,
    noise: float = 2.0,
) -> Signal:
    """Smooth oscillation between ``low`` and ``high``."""
    middle, amplitude = (high + low) / 2, (high - low) / 2
    clean = _sampled(n, period, rng, lambda phase: middle + amplitude * np.sin(2 * np.pi * phase))
    return _finish(clean, noise, rng)


def spikes(
    n: int,
    period: float,
    rng: np.random.Generator,
    *,
    width: float = 1.0,
    low: float = 2.0,
    high: float = 90.0,
    noise: float = 1.5,
) -> Signal:
    """A short busy burst of ``width`` samples per iteration, near idle in between."""
    clean = _sampled(n, period, rng, lambda phase: np.where(phase < width / period, high, low))
    return _finish(clean, noise, rng)


def short_steps(
    seconds: float,
    rng: np.random.Generator,
    *,
    step: float = 1.8,
    busy: float = 0.45,
    jitter: float = 0.2,
    resolution: float = 0.1,
    high: float = 95.0,
    low: float = 3.0,
    noise: float = 2.0,
) -> Signal:
    """Sub-second-to-second training steps as the driver samples them every ``resolution``
    seconds: each step lasts ``step`` seconds ± ``jitter`` (a share; sequence lengths vary)
    and keeps the GPU at ``high`` for its first ``busy`` seconds, at ``low`` while the host
    prepares the next batch. The defaults are a LoRA fine-tune's: 1.8 s steps, busy a quarter of
    the time, which one reading a second averages into a flat 25 %."""
    count = round(seconds / resolution)
    edges = np.cumsum(step * (1 + rng.uniform(-jitter, jitter, math.ceil(seconds / step) * 2)))
    edges = np.concatenate(([0.0], edges))
    # Eight points per sample: each sample is the busy share of its interval.
    points = (np.arange(count * 8) + 0.5) * resolution / 8
    phase = points - edges[np.searchsorted(edges, points, side="right") - 1]
    share = (phase < busy).reshape(count, 8).mean(axis=1)
    return _finish(low + (high - low) * share, noise, rng)


def with_jitter(values: Signal, period: float, jitter: float, rng: np.random.Generator) -> Signal:
    """Time-warp a periodic signal so each iteration lasts ``period * (1 ± jitter)`` samples.

    Iteration ``k`` of the output replays a whole iteration of ``values`` stretched to its own
    length; the mean period stays ``period``.
    """
    n = values.size
    cycles = math.ceil(n / (period * (1 - jitter))) + 2
    lengths = period * (1 + rng.uniform(-jitter, jitter, cycles))
    starts = np.concatenate(([0.0], np.cumsum(lengths)))
    position = np.arange(n, dtype=float)
    cycle = np.searchsorted(starts, position, side="right") - 1
    within = (position - starts[cycle]) / lengths[cycle]
    source_cycles = max(1, math.floor((n - 1) / period))
    source = ((cycle % source_cycles) + within) * period
    return np.interp(source, np.arange(n, dtype=float), values)


def with_eval_dip(
    values: Signal,
    start: int,
    length: int,
    rng: np.random.Generator,
    *,
    level: float = 30.0,
    noise: float = 2.0,
) -> Signal:
    """Replace ``length`` samples from ``start`` by a steady evaluation load around ``level``."""
    dipped = values.copy()
    stop = min(values.size, start + length)
    dipped[start:stop] = _finish(np.full(stop - start, level), noise, rng)
    return dipped


def with_gaps(
    values: Signal, fraction: float, rng: np.random.Generator, longest: int = 5
) -> Signal:
    """Blank runs of 1..``longest`` samples (missed scrapes) until about ``fraction`` is NaN."""
    gapped = values.copy()
    runs = max(1, round(fraction * values.size / ((1 + longest) / 2)))
    starts = rng.integers(0, values.size, runs)
    lengths = rng.integers(1, longest + 1, runs)
    for start, length in zip(starts, lengths, strict=True):
        gapped[start : start + length] = np.nan
    return gapped


def steady_serving(
    n: int,
    rng: np.random.Generator,
    *,
    level: float = 55.0,
    drift: float = 12.0,
    noise: float = 4.0,
    memory: float = 0.7,
) -> Signal:
    """Sustained request load: a slow drift of ``drift`` points over the window plus AR(1) noise.

    The drift is a fraction of a slow wave (period 1.5-4 windows), so it never repeats within
    the window; ``memory`` is the AR(1) coefficient of the request-rate fluctuations.
    """
    position = np.arange(n, dtype=float)
    slow = drift * np.sin(2 * np.pi * position / (n * rng.uniform(1.5, 4.0)) + rng.uniform(0, 6.3))
    shocks = rng.normal(0.0, noise * math.sqrt(1 - memory**2), n)
    # AR(1) as a convolution with its impulse response, truncated where it falls below 1e-6.
    taps = max(1, math.ceil(math.log(1e-6) / math.log(memory))) if 0 < memory < 1 else 1
    fluctuation = np.convolve(shocks, memory ** np.arange(taps))[:n]
    return _finish(level + slow + fluctuation, 0.0, rng)


def random_walk(
    n: int,
    rng: np.random.Generator,
    *,
    start: float = 50.0,
    step: float = 2.0,
    low: float = 15.0,
    high: float = 95.0,
) -> Signal:
    """A walk with Gaussian steps of ``step`` points, reflected to stay within [low, high]."""
    path = start + np.cumsum(rng.normal(0.0, step, n))
    width = high - low
    folded = np.mod(path - low, 2 * width)
    return np.where(folded > width, 2 * width - folded, folded) + low


def sporadic_bursts(
    n: int,
    rng: np.random.Generator,
    *,
    bursts: int = 4,
    shortest: int = 3,
    longest: int = 20,
    level: float = 85.0,
    noise: float = 3.0,
    idle_level: float = 1.0,
) -> Signal:
    """``bursts`` busy stretches of random length at random times, near idle in between."""
    clean = np.full(n, idle_level)
    starts = rng.integers(0, max(1, n - shortest), bursts)
    lengths = rng.integers(shortest, longest + 1, bursts)
    for start, length in zip(starts, lengths, strict=True):
        clean[start : start + length] = level
    return _finish(clean, noise, rng)


def near_zero_noise(n: int, rng: np.random.Generator, level: float = 1.0) -> Signal:
    """An idle GPU: readings of a few percent at most (|N(0, level)|)."""
    return np.clip(np.abs(rng.normal(0.0, level, n)), 0.0, 100.0)


class LabelledSignal(NamedTuple):
    name: str
    values: Signal
    step_seconds: float
    job_type: str
    period_seconds: float | None


# (name, window seconds, step seconds, periods in samples used for training cases)
WINDOWS: tuple[tuple[str, float, float, tuple[float, ...]], ...] = (
    ("2m@1s", 120, 1, (6, 17.5, 36)),
    ("2m@10s", 120, 10, (4,)),
    ("30m@1s", 1800, 1, (7.5, 45, 300, 540)),
    ("30m@10s", 1800, 10, (6, 24.5, 54)),
    ("30m@30s", 1800, 30, (4, 9.5, 18)),
    ("1h@5s", 3600, 5, (12.5, 90, 216)),
    ("6h@10s", 21600, 10, (9.4, 60, 330, 650.5)),
)


def _training_cases(
    n: int, period: float, rng: np.random.Generator
) -> Iterator[tuple[str, Signal]]:
    yield "square", square(n, period, rng, duty=rng.uniform(0.3, 0.7), noise=3.0)
    # Busy at least one whole sample per iteration, or the loop is invisible when sampled.
    narrow = max(0.2, 1.0 / period)
    yield "square-narrow", square(n, period, rng, duty=narrow, low=10.0, noise=3.0)
    yield "sawtooth", sawtooth(n, period, rng, noise=3.0)
    yield "sine", sine(n, period, rng, noise=3.0)
    yield "spikes", spikes(n, period, rng, width=max(1.0, period / 8))
    if n < 100:
        return
    yield "square-jitter", with_jitter(square(n, period, rng), period, 0.1, rng)
    yield (
        "spikes-jitter",
        with_jitter(spikes(n, period, rng, width=max(1.0, period / 8)), period, 0.1, rng),
    )
    if n >= 8 * period:
        cycle = square(n, period, rng, duty=0.6)
        yield "square-eval-dip", with_eval_dip(cycle, n // 2, max(3, n // 12), rng)
    yield "sine-gaps", with_gaps(sine(n, period, rng), 0.05, rng, longest=3)
    yield (
        "sawtooth-jitter-gaps",
        with_gaps(with_jitter(sawtooth(n, period, rng), period, 0.08, rng), 0.03, rng, longest=2),
    )


def _other_cases(n: int, rng: np.random.Generator) -> Iterator[tuple[str, Signal, str]]:
    yield "serving", steady_serving(n, rng), INFERENCE
    yield "serving-low", steady_serving(n, rng, level=25.0, drift=8.0, noise=3.0), INFERENCE
    yield "random-walk", random_walk(n, rng), INFERENCE
    yield "random-walk-wide", random_walk(n, rng, step=4.0, low=10.0, high=100.0), INFERENCE
    bursts = 3 if n < 100 else 4
    shortest, longest = (1, 2) if n < 100 else (max(2, n // 100), max(4, n // 20))
    yield (
        "bursts",
        sporadic_bursts(n, rng, bursts=bursts, shortest=shortest, longest=longest),
        BURSTY,
    )
    yield "near-zero", near_zero_noise(n, rng), IDLE
    yield "near-zero-noisy", near_zero_noise(n, rng, level=1.5), IDLE
    yield "zeros", np.zeros(n), IDLE
    if n >= 100:
        yield "serving-gaps", with_gaps(steady_serving(n, rng), 0.05, rng), INFERENCE
        yield (
            "bursts-gaps",
            with_gaps(
                sporadic_bursts(n, rng, bursts=5, shortest=shortest, longest=longest), 0.03, rng
            ),
            BURSTY,
        )


def labelled_corpus(seed: int = 20261122) -> Iterator[LabelledSignal]:
    """Every shape in every window of ``WINDOWS``, labelled with the expected job type/period."""
    rng = np.random.default_rng(seed)
    for window_name, window, step, periods in WINDOWS:
        n = round(window / step)
        for period in periods:
            for shape, values in _training_cases(n, period, rng):
                name = f"{shape}-{window_name}-p{period * step:g}s"
                yield LabelledSignal(name, values, step, TRAINING, period * step)
        for shape, values, job_type in _other_cases(n, rng):
            yield LabelledSignal(f"{shape}-{window_name}", values, step, job_type, None)
