"""The pod's disk/network rates and the input-bound hint (``analysis.io``)."""

from __future__ import annotations

import numpy as np
import pytest

from profiler_app.analysis.io import coincidence, input_bound_reason, io_rates, on_grid
from profiler_app.core.model import (
    DISK_READ,
    DISK_WRITE,
    NETWORK_RECEIVE,
    NETWORK_TRANSMIT,
    PodIoSeries,
)

MIB = 2.0**20
PERIOD = 10  # samples per training iteration
SAMPLES = 360


def training_loop(rng: np.random.Generator, stall: int = 3) -> np.ndarray:
    """Utilisation of a training loop: ``PERIOD - stall`` samples near 95 %, ``stall`` near 5 %."""
    phase = np.arange(SAMPLES) % PERIOD
    util = np.where(phase < PERIOD - stall, 95.0, 5.0)
    return np.clip(util + rng.normal(0, 2, SAMPLES), 0, 100)


def grid() -> np.ndarray:
    return 1_700_000_000.0 + np.arange(SAMPLES, dtype=np.float64)


def series(**rates: np.ndarray) -> PodIoSeries:
    return PodIoSeries(grid(), dict(rates))


def test_reads_bursting_as_each_stall_begins_are_input_bound() -> None:
    rng = np.random.default_rng(1)
    util = training_loop(rng)
    phase = np.arange(SAMPLES) % PERIOD
    # The loader reads each batch as the GPU runs dry: the sample before and the first of the
    # stall. Writes stay low.
    reads = np.where((phase == PERIOD - 4) | (phase == PERIOD - 3), 80 * MIB, 0.5 * MIB)
    reads = reads + rng.uniform(0, 0.2 * MIB, SAMPLES)
    io = series(disk_read=reads, disk_write=np.full(SAMPLES, 0.1 * MIB))
    reason = input_bound_reason(util, grid(), io)
    assert reason is not None
    assert reason.startswith("stalls follow disk reads: likely input-bound")
    observed, chance, episodes = coincidence(util, reads) or (0.0, 1.0, 0)
    assert observed == 1.0
    assert chance == pytest.approx(0.3, abs=0.05)  # 3 of 10 samples of each iteration
    assert episodes == SAMPLES // PERIOD


def test_network_receives_count_only_where_attributable() -> None:
    rng = np.random.default_rng(2)
    util = training_loop(rng)
    phase = np.arange(SAMPLES) % PERIOD
    received = np.where(phase == PERIOD - 3, 120 * MIB, 1 * MIB)
    io = series(network_receive=received)
    assert (input_bound_reason(util, grid(), io) or "").startswith(
        "stalls follow network receives: likely input-bound"
    )
    hidden = PodIoSeries(grid(), {NETWORK_RECEIVE: received}, network_attributable=False)
    assert input_bound_reason(util, grid(), hidden) is None


def test_periodic_checkpoint_writes_do_not_make_a_loop_input_bound() -> None:
    """Every 60 samples the job stops for a checkpoint: a long stall with a write burst. Reads
    stream steadily (prefetched); no input burst lines up with the stalls."""
    rng = np.random.default_rng(3)
    util = training_loop(rng)
    checkpoint = (np.arange(SAMPLES) % 60) >= 54
    util[checkpoint] = 2.0
    writes = np.where(checkpoint, 900 * MIB, 0.2 * MIB)
    reads = 40 * MIB + rng.normal(0, 2 * MIB, SAMPLES)
    io = series(disk_read=reads, disk_write=writes, network_transmit=writes)
    assert input_bound_reason(util, grid(), io) is None


def test_writes_at_every_stall_are_output_not_input() -> None:
    """A job that writes (logs, small checkpoints) as each step ends: the writes line up with
    every stall, and still say nothing of the input. The same series as reads would."""
    rng = np.random.default_rng(8)
    util = training_loop(rng)
    phase = np.arange(SAMPLES) % PERIOD
    writes = np.where(phase == PERIOD - 3, 300 * MIB, 0.2 * MIB)
    io = series(disk_read=np.full(SAMPLES, 5 * MIB), disk_write=writes, network_transmit=writes)
    assert input_bound_reason(util, grid(), io) is None
    assert input_bound_reason(util, grid(), series(disk_read=writes)) is not None


def test_reads_in_the_middle_of_compute_are_prefetching_not_input_bound() -> None:
    rng = np.random.default_rng(4)
    util = training_loop(rng)
    phase = np.arange(SAMPLES) % PERIOD
    reads = np.where(phase == 2, 80 * MIB, 0.5 * MIB)  # mid-compute, the same rhythm
    assert input_bound_reason(util, grid(), series(disk_read=reads)) is None
    observed, chance, _ = coincidence(util, reads) or (1.0, 0.0, 0)
    assert observed < chance  # misaligned: fewer stalls beside a read than shifted ones


def test_random_read_bursts_are_chance_not_input_bound() -> None:
    rng = np.random.default_rng(5)
    util = training_loop(rng)
    reads = np.where(rng.random(SAMPLES) < 0.25, 60 * MIB, 0.5 * MIB)
    assert input_bound_reason(util, grid(), series(disk_read=reads)) is None
    observed, chance, _ = coincidence(util, reads) or (0.0, 0.0, 0)
    assert abs(observed - chance) < 0.2


def test_busy_reads_at_every_sample_are_no_burst_and_low_rates_are_no_input() -> None:
    rng = np.random.default_rng(6)
    util = training_loop(rng)
    phase = np.arange(SAMPLES) % PERIOD
    tiny = np.where(phase == PERIOD - 3, 200_000.0, 1_000.0)  # aligned, but 0.2 MB/s at most
    assert input_bound_reason(util, grid(), series(disk_read=tiny)) is None
    assert coincidence(util, np.full(SAMPLES, 300 * MIB)) is None


def test_a_single_coincidence_is_not_enough() -> None:
    rng = np.random.default_rng(7)
    util = np.clip(95 + rng.normal(0, 2, SAMPLES), 0, 100)
    util[100:104] = 3.0  # one stall, with one read burst: no rhythm to judge
    reads = np.full(SAMPLES, 0.5 * MIB)
    reads[99:102] = 100 * MIB
    assert input_bound_reason(util, grid(), series(disk_read=reads)) is None


def test_coarse_input_series_are_held_and_fine_ones_keep_their_bursts() -> None:
    fine_grid = np.arange(0.0, 100.0, 10.0)
    # Readings every 30 s: each holds for the grid samples after it, at most two spacings.
    held = on_grid(np.array([0.0, 30.0, 60.0]), np.array([1.0, 2.0, 3.0]), fine_grid)
    assert held.tolist()[:9] == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0]
    assert np.isnan(held[9])  # 90 s: the last reading is three spacings old
    # Readings every second onto a 10 s grid: each sample keeps the largest of its interval.
    times = np.arange(0.5, 100.0, 1.0)
    values = np.zeros(times.size)
    values[33] = 7.0  # 33.5 s: inside (30, 40]
    peaks = on_grid(times, values, fine_grid)
    assert peaks[4] == 7.0
    assert peaks[3] == 0.0


def test_rates_are_peaks_and_95th_percentiles_of_each_measured_direction() -> None:
    values = np.arange(101, dtype=np.float64) * MIB
    values[50] = np.nan
    rates = io_rates(series(disk_read=values, disk_write=np.full(101, np.nan)))
    assert rates is not None
    assert rates.stat(DISK_READ, "max") == 100 * MIB
    assert rates.stat(DISK_READ, "p95") == pytest.approx(
        np.percentile(values[~np.isnan(values)], 95)
    )
    assert rates.stat(DISK_WRITE, "max") is None  # no reading at all
    assert rates.stat(NETWORK_TRANSMIT, "p95") is None
    assert io_rates(series()) is None
    hidden = io_rates(PodIoSeries(grid(), {}, network_attributable=False))
    assert hidden is not None
    assert not hidden.network_attributable
