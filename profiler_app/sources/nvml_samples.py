"""NVML's buffered utilisation samples: sub-second steps instead of one reading per tick.

The driver keeps a utilisation sample every 1/6 s to 1 s, depending on the product, and
``nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, last_seen)`` returns the ones taken
since ``last_seen`` (CPU time in microseconds). Read once per sampler tick, they put utilisation
on a ``BUFFERED_STEP_SECONDS`` grid: a training step of 0.3-2 s then shows as a loop, where one
reading per second averages it into a flat level (a LoRA fine-tune with 1.8 s steps reads a flat
25 % at 1 s). Where the call is unsupported (MIG, some older drivers and virtual GPUs: NVML
answers NOT_SUPPORTED, or the bindings lack the function), the GPU keeps one reading per tick.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from profiler_app.core.model import FloatMatrix

log = logging.getLogger(__name__)

# The grid of buffered samples: finer than any driver's sampling period.
BUFFERED_STEP_SECONDS = 0.1
# Samples kept per GPU (one hour at 0.1 s, about 300 KiB): a longer window gets a coarser grid.
MAX_BUFFERED_SAMPLES = 36_000
# A sample stands for the driver's sampling period before it, at most this long (NVML: 1/6 s to
# 1 s): grid points with no sample that recent stay empty rather than borrow a stale one.
MAX_SAMPLE_COVER_SECONDS = 1.0
# NVML stamps samples with the CPU clock; a stamp further than this from our clock (another
# clock base) is put on ours by the offset seen in the first answer.
MAX_CLOCK_SKEW_SECONDS = 5.0
# pynvml's value types (nvmlValueType_t) and the union member each is read from.
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def buffered_step(window_seconds: float, sample_interval: float) -> float | None:
    """The grid step for buffered samples, or None when it would be no finer than the
    sampler's own interval (nothing to gain)."""
    step = max(BUFFERED_STEP_SECONDS, window_seconds / MAX_BUFFERED_SAMPLES)
    return step if step < sample_interval else None


def _value(sample: Any, value_type: int) -> float:
    field = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
    return float(getattr(sample.sampleValue, field))


class UtilisationSamples:
    """Per GPU: whether the driver buffers utilisation samples, and the last one read."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self._kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", 1)
        self.supported = [False] * count
        self._last_seen = [0] * count  # microseconds, the driver's clock
        self._offset: list[float | None] = [None] * count  # seconds to add to the driver's
        self._failed: set[str] = set()  # failures said once at warning level

    def _get(self, handle: Any, since: int) -> tuple[int, list[Any]]:
        value_type, samples = self._nvml.nvmlDeviceGetSamples(handle, self._kind, since)
        return int(value_type), list(samples)

    def probe(self, handles: Sequence[Any], names: Sequence[str]) -> bool:
        """Asks each GPU once; True when any buffers samples. Samples taken before this call
        are skipped."""
        nvml = self._nvml
        for position, (handle, name) in enumerate(zip(handles, names, strict=True)):
            try:
                _, samples = self._get(handle, 0)
            except nvml.NVMLError_NotFound:  # supported, nothing buffered yet
                samples = []
            except (nvml.NVMLError, AttributeError) as error:
                log.info(
                    "GPU %s: no buffered utilisation samples from NVML (%s); one reading per "
                    "sampler tick",
                    name,
                    error,
                )
                continue
            self.supported[position] = True
            if samples:
                self._last_seen[position] = max(int(sample.timeStamp) for sample in samples)
        return any(self.supported)

    def fetch(self, position: int, handle: Any, now: float) -> tuple[FloatMatrix, FloatMatrix]:
        """The samples taken since the last call: their times (seconds on our clock, ascending)
        and values (percent). Empty when none; a GPU that stops supporting the call (NVML
        answered NOT_SUPPORTED) falls back to one reading per tick for good."""
        nvml = self._nvml
        empty = np.zeros(0)
        if not self.supported[position]:
            return empty, empty
        try:
            value_type, samples = self._get(handle, self._last_seen[position])
        except nvml.NVMLError_NotFound:
            return empty, empty
        except nvml.NVMLError_NotSupported as error:
            self.supported[position] = False
            log.warning("GPU %d: buffered utilisation samples stopped (%s)", position, error)
            return empty, empty
        except nvml.NVMLError as error:  # transient: the tick's own reading stands in
            key = f"{position}: {error}"
            log.log(
                logging.DEBUG if key in self._failed else logging.WARNING,
                "GPU %d: reading buffered utilisation samples failed: %s",
                position,
                error,
            )
            self._failed.add(key)
            return empty, empty
        if not samples:
            return empty, empty
        stamps = np.array([int(sample.timeStamp) for sample in samples], dtype=np.int64)
        values = np.array([_value(sample, value_type) for sample in samples])
        order = np.argsort(stamps, kind="stable")
        stamps, values = stamps[order], values[order]
        self._last_seen[position] = int(stamps[-1])
        times = stamps / 1e6
        offset = self._offset[position]
        if offset is None or abs(times[-1] + offset - now) > MAX_CLOCK_SKEW_SECONDS:
            offset = now - times[-1] if abs(times[-1] - now) > MAX_CLOCK_SKEW_SECONDS else 0.0
            self._offset[position] = offset
        return times + offset, values


def covering(times: FloatMatrix, values: FloatMatrix, points: FloatMatrix) -> FloatMatrix:
    """The value at each of ``points`` (seconds): that of the first sample at or after it (a
    sample covers the sampling period before it), NaN where none follows within
    ``MAX_SAMPLE_COVER_SECONDS``. ``times`` ascending."""
    found = np.full(points.shape, np.nan)
    if times.size == 0:
        return found
    after = np.searchsorted(times, points - 1e-6, side="left")  # a microsecond of rounding
    inside = after < times.size
    near = np.zeros(points.shape, dtype=bool)
    near[inside] = times[after[inside]] - points[inside] <= MAX_SAMPLE_COVER_SECONDS
    found[near] = values[after[near]]
    return found


def tick_floor(timestamp: float, origin: float, step: float) -> int:
    """The last grid tick at or before ``timestamp`` (a small tolerance for float rounding)."""
    return math.floor((timestamp - origin) / step + 1e-9)
