"""``gpu-profiler demo``: two made-up days of a small cluster in a SQLite store of its own, so that
every ``report`` view can be tried without a GPU or a cluster.

The days (``sources.synthetic``) go through the store's real writer, one cycle per node every
5 minutes, as the daemon writes at its default store interval; one trial run of placements is
recorded beside it for ``report --by trial``. Everything in it is synthetic, and the store is
a separate file (never the daemon's store) that each run replaces.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import platformdirs

from profiler_app.commands import SUMMARIES
from profiler_app.core.errors import UserError

DEMO_FILE = "demo.db"
CYCLE_SECONDS = 300.0  # the daemon's default --store-interval
DEMO_TRIAL_RUN = "demo0001"
DAYS = 2  # right-sizing wants 24 h of a workload's history


def default_demo_url() -> str:
    return f"sqlite:///{Path(platformdirs.user_data_dir('gpu-profiler')) / DEMO_FILE}"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "demo",
        help=SUMMARIES["demo"],
        description="Write two made-up days of two GPU nodes (a fine-tuning job that restarts, a "
        "serving Deployment rolled out at noon, an idle notebook, a nightly CronJob, unused "
        "GPUs) and one trial run into a SQLite store of its own, through the store's real "
        "writer; then print the report commands to try. The store is replaced on each run.",
    )
    parser.add_argument(
        "--store-url",
        default=default_demo_url(),
        metavar="URL",
        help="the demo store, sqlite:///PATH of a file that is replaced (default: %(default)s)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from profiler_app.sinks.store.urls import parse_store_url  # noqa: PLC0415

    url = parse_store_url(args.store_url)
    path = url.sqlite_path()
    if path is None:  # a real store is no place for made-up rows
        raise UserError("--store-url: the demo writes only a SQLite file, sqlite:///PATH")
    for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        stale.unlink(missing_ok=True)
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(days=DAYS)
    cycles = _write_day(args.store_url, start)
    _write_trial(args.store_url)
    shown = url.display()
    print(
        f"wrote {DAYS} synthetic days ({start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC, "
        f"{cycles:,} cycles of 2 nodes x 4 GPUs) and one trial run to {shown}\ntry:",
        file=sys.stderr,
    )
    for view in ("node", "gpu", "pod", "idle-pods", "waste", "rightsize", "trial"):
        print(f"  gpu-profiler report --store-url {args.store_url} --by {view}", file=sys.stderr)
    return 0


def _write_day(store_url: str, start: datetime) -> int:
    from profiler_app.commands import progress  # noqa: PLC0415
    from profiler_app.sinks.store.sink import TableStore  # noqa: PLC0415
    from profiler_app.sources.synthetic import synthetic_days  # noqa: PLC0415

    store = TableStore(store_url)
    count = 0
    try:
        with progress.spinner("writing synthetic days through the store's writer"):
            for cycle in synthetic_days(start, DAYS, cycle_seconds=CYCLE_SECONDS):
                store.publish(cycle)
                count += 1
    finally:
        store.close()
    return count


def _write_trial(store_url: str) -> None:
    """One run of trials of the fine-tuning job on other placements: made-up figures in the
    shape ``trial run`` records."""
    from profiler_app.sinks.store.trials import TrialStore  # noqa: PLC0415

    h100, a100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
    base = {"pods": 1, "nodes": 1, "layout": "packed", "status": "ok", "estimator": "step-regex"}
    trials = [  # (GPUs, model, samples/s, step seconds, peak framebuffer MiB, SM active)
        (1, h100, 410.0, 0.312, 66_000, 0.71),
        (2, h100, 790.0, 0.324, 66_500, 0.69),
        (4, h100, 1_420.0, 0.361, 67_000, 0.62),
        (1, a100, 205.0, 0.624, 66_000, 0.78),
        (2, a100, 398.0, 0.643, 66_400, 0.76),
    ]
    one_gpu = {model: rate for gpus, model, rate, *_ in trials if gpus == 1}
    rows = []
    for index, (gpus, model, rate, step, fb, sm) in enumerate(trials):
        rows.append(
            {
                **base,
                "trial": f"trial-{DEMO_TRIAL_RUN}-{index}",
                "workload": "PyTorchJob/ml/llama-finetune",
                "placement": f"{gpus} GPU{'s' if gpus > 1 else ''} on {model}",
                "gpu_model": model,
                "gpus": gpus,
                "gpus_per_pod": gpus,
                "throughput": rate,
                "unit": "samples/s",
                "throughput_per_gpu": rate / gpus,
                "scaling_efficiency": rate / (gpus * one_gpu[model]),
                "step_seconds": step,
                "peak_fb_mib": float(fb),
                "sm_active": sm,
                "gpu_seconds": 600.0 * gpus,
                "pareto": model == h100,
                "recommended": (gpus, model) == (2, h100),
                "note": "synthetic (gpu-profiler demo)",
                "recommendation": "2 GPUs on NVIDIA-H100-80GB-HBM3: 96 % scaling efficiency",
            }
        )
    store = TrialStore(store_url)
    try:
        store.record(DEMO_TRIAL_RUN, rows)
    finally:
        store.close()
