"""How fast ``gpu-profiler trace`` summarises a big report, run by hand:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_trace.py [--kernels 1000000] [--repeat 3]

Builds an Nsight Systems export (test double, ``tests/support/nsys/``: the documented
schema, no GPU or nsys here) of a training loop: ``--kernels`` kernels over 20 names on two
overlapping streams, each launched by a ``cudaLaunchKernel`` call (as many CUDA API rows), a
host-to-device copy and a ``cudaStreamSynchronize`` per step of 500 kernels, an input gap
between steps, no NVTX (so the iteration comes from the kernel sequence, the slower path).
The same report is written twice: every table's rows in time order (sorted by start, as
Nsight Systems appears to write them), and rows shuffled (exports do not promise an order).
Goal: a million kernel rows summarised in under 2 s of CPU on one core.

SQLite and numpy run single-threaded, so the figures are one core's. Each summary runs in a
fresh process (its first large allocations fault pages in, as a real run's do) and its CPU time
(user + system) is printed beside the wall time, since other jobs may share the machine; then
the CPU time of each stage (one run), and of ``gpu-profiler trace`` as a whole new process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from profiler_app.trace import columns, groups, iterations, timeline
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import summarise
from tests.support.nsys.builder import ReportBuilder
from tests.support.nsys.schema import HTOD

KERNELS_PER_STEP = 500
NAMES = 20
US = 1_000


def build(kernels: int, rng: np.random.Generator) -> ReportBuilder:
    report = ReportBuilder()
    steps = max(kernels // KERNELS_PER_STEP, 1)
    durations = rng.integers(2 * US, 60 * US, kernels)
    gaps = rng.integers(1 * US, 8 * US, kernels)
    starts = np.cumsum(durations + gaps) - durations
    step_of = np.minimum(np.arange(kernels) // KERNELS_PER_STEP, steps - 1)
    starts += step_of * 3_000 * US  # 3 ms waiting for the next batch before each step
    names = rng.integers(0, NAMES, kernels)
    for index in range(NAMES):
        chosen = names == index
        report.add_kernels(
            f"void kernel_{index:02d}<float, 128>(float *, const float *, int)",
            starts[chosen],
            durations[chosen],
            stream=7 + index % 2,  # two streams: overlapping intervals count once
        )
    first = starts[np.searchsorted(step_of, np.arange(steps))]
    report.add_copies(HTOD, first - 400 * US, 300 * US, 8 << 20)
    last = starts[np.searchsorted(step_of, np.arange(steps), side="right") - 1]
    report.add_api_calls("cudaStreamSynchronize_v3020", last - 10 * US, last + 80 * US)
    return report


def timed(function: Callable[[], Any]) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return time.perf_counter() - wall, time.process_time() - cpu, result


# (module, function) of each stage of a summary, timed apart
STAGES = (
    (columns, "read"),  # the event columns, all tables
    (groups, "kernel_groups"),  # with the launch join
    (groups, "memory_groups"),
    (groups, "api_groups"),
    (timeline, "build"),  # the interval union and its idle gaps
    (iterations, "from_activity"),  # the busy signal per bin and its period
)


def stage_times(path: Path) -> dict[str, float]:
    """CPU seconds per stage during one summary."""
    spent: dict[str, float] = {}
    originals = []
    for module, name in STAGES:
        original = getattr(module, name)
        originals.append((module, name, original))

        def wrapper(*args: Any, _name: str = name, _f: Any = original, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return _f(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.process_time() - start

        setattr(module, name, wrapper)
    try:
        start = time.process_time()
        with open_report(str(path)) as export:
            summarise(export)
        spent["total"] = time.process_time() - start
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
    spent["the rest"] = spent["total"] - sum(v for k, v in spent.items() if k != "total")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the reports here and keep them")
    parser.add_argument("--child", metavar="REPORT", help=argparse.SUPPRESS)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --keep: summarise the reports an earlier run left in DIR (same --kernels)",
    )
    args = parser.parse_args()
    if args.child:
        child(Path(args.child))
        return
    directory = Path(args.keep or tempfile.mkdtemp(prefix="bench-trace-"))
    directory.mkdir(parents=True, exist_ok=True)
    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    orders = (("time order", False), ("shuffled", True))
    paths = {order: directory / f"{order.split()[0]}.sqlite" for order, _ in orders}
    if not (args.reuse and args.keep and all(path.exists() for path in paths.values())):
        wall, _, report = timed(lambda: build(args.kernels, np.random.default_rng(7)))
        print(f"built {args.kernels:,} kernels in {wall:.1f} s")
        for order, shuffle in orders:
            report.write(paths[order], shuffle=shuffle, time_order=not shuffle)
    for order, _ in orders:
        path = paths[order]
        size = path.stat().st_size / 2**20
        runs = [_fresh_summary(path) for _ in range(args.repeat)]
        cpu = sorted(run["user"] + run["sys"] for run in runs)
        print(
            f"{order}: {size:.0f} MiB; summarise in a fresh process, {args.repeat} runs: CPU "
            f"(user + sys) median {cpu[len(cpu) // 2]:.2f} s, best {cpu[0]:.2f} s "
            f"(user/sys/wall: "
            + ", ".join(f"{r['user']:.2f}/{r['sys']:.2f}/{r['wall']:.2f}" for r in runs)
            + f"); peak RSS {max(r['peak_mib'] for r in runs):.0f} MiB; {runs[0]['result']}"
        )
        stages = stage_times(path)
        print("  CPU by stage: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        whole = []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([*TRACE_COMMAND, str(path)], check=True, capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            whole.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        whole.sort()
        print(
            f"  gpu-profiler trace --output json as a new process (start-up and imports "
            f"included): CPU median {whole[len(whole) // 2]:.2f} s, best {whole[0]:.2f} s"
        )


TRACE_COMMAND = [
    sys.executable,
    "-m",
    "profiler_app",
    "trace",
    "--store-url",
    "none",
    "--output",
    "json",
]


def _fresh_summary(path: Path) -> dict[str, Any]:
    """One ``summarise`` in a new Python process (``--child``): its CPU time includes the
    page faults of a process's first large allocations, as a real run's does."""
    completed = subprocess.run(
        [sys.executable, __file__, "--child", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(completed.stdout)


def child(path: Path) -> None:
    """Summarise ``path`` once; print user, system and wall seconds of that alone, as JSON."""
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    summary = _summary(path)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall
    gpu = summary.gpus[0]
    iteration = summary.iteration.seconds * 1e3 if summary.iteration else float("nan")
    result = (
        f"verdict {gpu.verdict.name}, busy {gpu.busy_fraction:.1%}, {gpu.gaps.count:,} gaps, "
        f"iteration {iteration:.2f} ms"
    )
    figures = {
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
        "wall": wall,
        "peak_mib": after.ru_maxrss / 1024,
        "result": result,
    }
    print(json.dumps(figures))


def _summary(path: Path) -> Any:
    with open_report(str(path)) as export:
        return summarise(export)


if __name__ == "__main__":
    main()
