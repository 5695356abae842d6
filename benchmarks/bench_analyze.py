"""``gpu-profiler analyze`` against a real Prometheus holding 100 nodes x 8 GPUs.

Run by hand from the repository root: ``.venv/bin/python benchmarks/bench_analyze.py``.
Backfills 40 minutes at 10 s of DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_MEM_COPY_UTIL and
DCGM_FI_DEV_FB_USED (the daemon's default fields) for every GPU, then analyses each node's
last 30 minutes in-process (source -> profiles -> JSON, as ``analyze --output json`` does),
and a few nodes through the console script. Prints wall time per node, requests per node
(client and server side) and bytes read.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler_app.core.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL  # noqa: E402
from profiler_app.profiles.build import build_profiles  # noqa: E402
from profiler_app.profiles.render import render_json  # noqa: E402
from profiler_app.sources.prometheus import PrometheusSource  # noqa: E402
from tests.support.dcgm import standard_dataset  # noqa: E402
from tests.support.prometheus import PrometheusServer  # noqa: E402

FIELDS = (GPU_UTIL, MEM_COPY_UTIL, FB_USED)


def cpu_model() -> str:
    for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True, check=False
    ).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=40)
    parser.add_argument("--window", type=float, default=1800, help="seconds")
    options = parser.parse_args()

    started = time.perf_counter()
    dataset = standard_dataset(
        options.nodes, options.gpus, options.minutes / 60, fields=FIELDS, seed=1
    )
    generated = time.perf_counter() - started
    samples = options.nodes * options.gpus * len(FIELDS) * round(options.minutes * 6)
    print(f"machine: {cpu_model()}, {len(__import__('os').sched_getaffinity(0))} CPUs")
    print(
        f"dataset: {options.nodes} nodes x {options.gpus} GPUs x {len(FIELDS)} fields, "
        f"{options.minutes:g} min at 10 s = {samples:,} samples "
        f"({len(dataset.openmetrics) / 1e6:.0f} MB of OpenMetrics, generated in {generated:.1f} s)"
    )

    with PrometheusServer(dataset.openmetrics) as server:
        print(f"backfill + start: {time.perf_counter() - started - generated:.1f} s")
        seconds: list[float] = []
        requests: list[int] = []
        sizes: list[int] = []
        wrong: list[str] = []
        served_before = server.requests_served()
        for node in dataset.nodes:
            begin = time.perf_counter()
            source = PrometheusSource(server.url, node, fields=FIELDS)
            profiles = build_profiles(source.read(options.window))
            render_json(profiles)
            source.close()
            seconds.append(time.perf_counter() - begin)
            requests.append(source.stats.requests)
            sizes.append(source.stats.bytes_read)
            wrong += [
                f"{node}/{p.gpu}: {p.job_type}, expected {dataset.expected[(node, p.gpu)][0]}"
                for p in profiles
                if p.job_type != dataset.expected[(node, p.gpu)][0]
            ]
        served = server.requests_served() - served_before

        script = Path(sys.executable).with_name("gpu-profiler")
        cli_seconds = []
        for node in dataset.nodes[:5]:
            begin = time.perf_counter()
            completed = subprocess.run(
                [str(script), "analyze", "--prometheus-url", server.url, "--node", node],
                check=False,
                capture_output=True,
                text=True,
            )
            if completed.returncode != 0:
                print(f"console script failed for {node}: {completed.stderr.strip()[-500:]}")
                continue
            cli_seconds.append(time.perf_counter() - begin)

    count = len(seconds)
    print(f"in-process, per node ({count} nodes, {options.window / 60:g} min window):")
    print(
        f"  wall time: median {statistics.median(seconds) * 1000:.1f} ms, "
        f"p95 {percentile(seconds, 0.95) * 1000:.1f} ms, max {max(seconds) * 1000:.1f} ms, "
        f"all nodes {sum(seconds):.2f} s"
    )
    print(
        f"  requests: {statistics.mean(requests):g} per node ({len(FIELDS)} fields); "
        f"Prometheus counted {served} query_range requests for {count} nodes"
    )
    print(
        f"  bytes read: median {statistics.median(sizes) / 1024:.0f} KiB per node, "
        f"{sum(sizes) / 1e6:.1f} MB for all nodes"
    )
    print(
        f"  GPUs classified differently from the dataset's labels: {len(wrong)} of "
        f"{count * options.gpus} {wrong[:5]}"
    )
    if cli_seconds:
        print(
            f"console script (process start included), median of {len(cli_seconds)}: "
            f"{statistics.median(cli_seconds) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
