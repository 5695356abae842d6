"""Cycles for the table store's tests, and what a store holds read back with SQLAlchemy.

One node (node-a) in namespace ml: ``profile`` a GPU's profile (training with a 12.5 s period
unless told otherwise), ``pod`` a pod's usage, ``cycle`` a cycle of both over a 30-minute window.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodUsage,
)
from profiler_app.sinks.store.engine import create_store_engine
from profiler_app.sinks.store.urls import parse_store_url

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = 1800.0


def profile(gpu: str, job_type: str = "training", util_max: float = 90.0) -> GpuProfile:
    return GpuProfile(
        gpu=gpu,
        uuid=f"GPU-{gpu}",
        hostname="node-a",
        job_type=job_type,
        period_seconds=12.5 if job_type == "training" else None,
        stats={
            GPU_UTIL: FieldStats(max=util_max, p95=util_max - 5, mean=50.0, idle_fraction=0.25),
            MEM_COPY_UTIL: FieldStats(max=40.0, p95=35.0, mean=20.0, idle_fraction=0.5),
            FB_USED: FieldStats(max=2048.0, p95=2000.0, mean=1500.0, idle_fraction=0.0),
        },
        namespace="ml",
        pod="train-0",
        confidence=0.8,
        reasons=("period 12s in util", "owner PyTorchJob"),
        basis="util-loop",
        owner_kind="PyTorchJob",
        owner_name="llama",
        engine="torchrun" if job_type == "training" else None,
        framework="pytorch" if job_type == "training" else None,
    )


def pod(name: str = "train-0", start: datetime | None = T0, **peaks: float | None) -> PodUsage:
    return PodUsage(namespace="ml", pod=name, node="node-a", start_time=start, gpus=("0",), **peaks)


def cycle(at: datetime, gpus: list[GpuProfile], pods: list[PodUsage] | None = None) -> CycleResult:
    return CycleResult(node="node-a", at=at, window_seconds=WINDOW, gpus=gpus, pods=pods or [])


def engine_for(url: str) -> sa.Engine:
    return create_store_engine(parse_store_url(url), create_file=False)


def fetch(url: str, query: str) -> list[Any]:
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text(query)).all())
    finally:
        engine.dispose()
