"""benchmarks/trial_gpu_pair.py's measuring, on a generated run (no GPU needed): the script alone
and a pair, each copy's stamped lines and the NVML waveform through the trial estimators."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.trial_gpu_pair import SAMPLE_SECONDS, measure

START = 1_790_000_000.0


def copy_lines(step: float, seconds: float) -> list[tuple[float, str]]:
    times = START + np.arange(step, seconds, step)
    return [
        (float(t), f"step={n} loss=1.0 samples_per_sec={256 / step:.1f}")
        for n, t in enumerate(times, 1)
    ]


def waveform(period: float, seconds: float) -> list[tuple[float, float]]:
    times = START + np.arange(0, seconds, SAMPLE_SECONDS)
    return [(float(t), 95.0 if (t - START) % period < 0.6 * period else 10.0) for t in times]


def test_alone_and_a_pair_measured_like_trials() -> None:
    samples = waveform(1.0, 60)
    alone = measure(
        {"started": START, "outputs": [copy_lines(0.5, 60)], "samples": samples}, warmup=10
    )
    (copy,) = alone["copies"]
    assert copy["step_regex_steps_per_sec"] == pytest.approx(2.0)
    assert copy["metric_samples_per_sec"] == pytest.approx(512.0)
    assert copy["stable"]
    assert alone["period_seconds"] == pytest.approx(1.0, rel=0.05)
    measured = [u for t, u in samples if t >= START + 10]
    assert alone["utilisation_proxy"] == pytest.approx(np.mean(measured) / 100)
    pair = measure(
        {
            "started": START,
            "outputs": [copy_lines(0.9, 60), copy_lines(1.1, 60)],
            "samples": waveform(2.0, 60),
        },
        warmup=10,
    )
    rates = [c["step_regex_steps_per_sec"] for c in pair["copies"]]
    assert rates == pytest.approx([1 / 0.9, 1 / 1.1])
