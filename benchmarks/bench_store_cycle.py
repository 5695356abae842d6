"""Time of one cycle's store write (``TableStore.publish``) as the table grows.

Run by hand from the repository root: ``PYTHONPATH=. .venv/bin/python
benchmarks/bench_store_cycle.py --prefill 10000`` (defaults: 8 GPUs, cycles 30 s apart, a
30-minute window, 300 timed cycles). A fresh SQLite store (or ``--store-url``) first holds
``--prefill`` cycles of one node, then the next cycles are timed one by one: each reads every
GPU's last row within the window from the store (covers_seconds) and writes its rows. The
commit's fsync (SQLite's synchronous=FULL) dominates on a shared disk, so the read of the last
rows is also timed alone, in a transaction of its own, ``--cycles`` times.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta

from profiler_app.core.model import GPU_UTIL, CycleResult, FieldStats, GpuProfile
from profiler_app.sinks.store import TableStore

START = datetime(2026, 11, 26, tzinfo=UTC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill", type=int, default=2000, help="cycles stored first")
    parser.add_argument("--cycles", type=int, default=300, help="cycles timed")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--store-url", help="default: a SQLite file in a temporary directory")
    options = parser.parse_args()
    stats = {GPU_UTIL: FieldStats(max=90.0, p95=80.0, mean=50.0, idle_fraction=0.1)}
    gpus = [
        GpuProfile(str(i), f"GPU-{i}", "node", "training", 60.0, stats) for i in range(options.gpus)
    ]
    with tempfile.TemporaryDirectory() as folder:
        store = TableStore(options.store_url or f"sqlite:///{folder}/profiler.db")

        def publish(number: int) -> float:
            began = time.perf_counter()
            store.publish(CycleResult("node", START + timedelta(seconds=30 * number), 1800, gpus))
            return time.perf_counter() - began

        for number in range(options.prefill):
            publish(number)
        timed = [publish(options.prefill + k) for k in range(options.cycles)]
        reads = []
        last = CycleResult("node", START + timedelta(seconds=30 * len(timed)), 1800, gpus)
        for _ in range(options.cycles):
            with store._database.transaction() as cursor:
                began = time.perf_counter()
                store._load_last_at(cursor, last)
                reads.append(time.perf_counter() - began)
        store.close()
    rows = (options.prefill + options.cycles) * options.gpus
    print(
        f"{options.gpus} GPUs, {rows:,} rows at the end: median "
        f"{1000 * statistics.median(timed):.2f} ms, p95 "
        f"{1000 * statistics.quantiles(timed, n=20)[-1]:.2f} ms per cycle over {options.cycles}; "
        f"the last-row read alone: median {1000 * statistics.median(reads):.3f} ms"
    )


if __name__ == "__main__":
    main()
