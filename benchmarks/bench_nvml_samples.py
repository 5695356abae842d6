"""CPU cost of local mode's sampler tick with NVML's buffered utilisation samples, run by hand:
python benchmarks/bench_nvml_samples.py

No GPU is needed, nor used: the sampler runs against the stand-in ``pynvml`` of the tests
(tests/support/nvml.py), eight GPUs each replaying a 0.1 s recording of 1.8 s training steps
(``signals.short_steps``), once with the buffered samples and once with one reading per tick
(the fallback under MIG). The difference is what reading the buffer and filling the 0.1 s grid
costs per tick; the stand-in's own calls are in both. A real driver's calls are not measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from profiler_app.profiles.build import build_profiles
from profiler_app.sources.nvml import NvmlSource
from tests.support import signals
from tests.support.nvml import Clock, FakeGpu, FakeNvml


def run(gpus: int, seconds: int, buffered: bool) -> tuple[float, NvmlSource]:
    """CPU seconds per sampler tick over ``seconds`` ticks of one second."""
    rng = np.random.default_rng(1)
    fake = [
        FakeGpu(f"GPU-{i}", "NVIDIA H100 80GB HBM3", waveform=signals.short_steps(seconds, rng))
        for i in range(gpus)
    ]
    clock = Clock()
    source = NvmlSource(
        "bench", seconds, 1.0, nvml=FakeNvml(fake, clock), clock=clock, buffered=buffered
    )
    assert source.open()
    started = time.process_time()
    for _ in range(seconds):
        clock.now += 1.0
        source.sample()
    return (time.process_time() - started) / seconds, source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=1800)
    args = parser.parse_args()
    buffered, source = run(args.gpus, args.seconds, True)
    single, _ = run(args.gpus, args.seconds, False)
    print(f"{args.gpus} GPUs, {args.seconds} ticks of 1 s, stand-in pynvml")
    print(f"tick with buffered samples: {buffered * 1e3:.2f} ms CPU")
    print(f"tick with one reading each: {single * 1e3:.2f} ms CPU")
    print(f"buffered samples add {(buffered - single) * 1e3:.2f} ms CPU per tick")
    started = time.process_time()
    profiles = build_profiles(source.read(args.seconds))
    elapsed = time.process_time() - started
    periods = sorted({round(p.period_seconds or 0, 1) for p in profiles})
    print(
        f"classifying the {args.gpus} GPUs at 0.1 s ({args.seconds * 10} samples each): "
        f"{elapsed * 1e3:.0f} ms CPU; job types {sorted({p.job_type for p in profiles})}, "
        f"periods {periods} s"
    )


if __name__ == "__main__":
    main()
