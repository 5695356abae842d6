"""Made-up days of a small GPU cluster, cycle by cycle, for ``gpu-profiler demo``.

Synthetic, and said so wherever it is used: two nodes of four GPUs (H100 and A100) running
what a real cluster runs on an ordinary day, with its mess: a fine-tuning job that restarts
mid-morning, a serving Deployment rolled out at noon with a daily load curve, a notebook that
holds a GPU it mostly leaves idle, a nightly embedding CronJob in bursts, and GPUs nobody uses.
Peaks and periods vary from cycle to cycle (a seeded random generator, so two runs agree).

It feeds the store's real writer (``TableStore.publish``), so every ``report`` view reads
rows as the daemon would have written them; it never stands in for a measurement.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from profiler_app.core.model import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    POWER_USAGE,
    SM_ACTIVE,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodShare,
    PodUsage,
)

WINDOW_SECONDS = 1800.0
_GIB = 1024.0


@dataclass(frozen=True)
class Workload:
    """One pod's stay on one GPU: from ``start`` to ``end`` hours into the day."""

    namespace: str
    pod: str
    owner_kind: str
    owner_name: str
    job_type: str  # idle, training, inference or bursty: what the classifier says of it
    start: float
    end: float
    fb_gib: float  # framebuffer it holds
    util: float  # typical peak utilisation, percent
    period_seconds: float | None = None  # a training step's period


@dataclass(frozen=True)
class Gpu:
    node: str
    index: str
    model: str
    workloads: tuple[Workload, ...]


H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def _cluster() -> list[Gpu]:
    """The day's plan, in hours from its start."""
    llama = ("ml", "PyTorchJob", "llama-finetune", "training")
    vllm = ("serving", "Deployment", "vllm-llama")
    return [
        Gpu("gpu-node-1", str(index), H100, (
            # The job fails at 07:40 and its operator recreates the pods ten minutes later.
            Workload(llama[0], f"llama-finetune-worker-{index}", *llama[1:], 1.0, 7.67, 64, 99,
                     112.0),
            Workload(llama[0], f"llama-finetune-worker-{index}", *llama[1:], 7.83, 15.0, 66, 99,
                     108.0),
        ))
        for index in (0, 1)
    ] + [
        Gpu("gpu-node-1", "2", H100, (
            Workload(vllm[0], "vllm-llama-7d9c4-x2kq8", *vllm[1:], "inference", 0.0, 12.0, 72, 70),
            Workload(vllm[0], "vllm-llama-5f6b8-m9t2w", *vllm[1:], "inference", 12.05, 24.0, 72,
                     75),
        )),
        Gpu("gpu-node-1", "3", H100, ()),
        Gpu("gpu-node-2", "0", A100, (
            Workload("dev", "jupyter-alice-0", "StatefulSet", "jupyter-alice", "idle", 0.0, 24.0,
                     3, 2),
        )),
        Gpu("gpu-node-2", "1", A100, tuple(
            Workload("batch", f"embed-nightly-2881{slot}-{tag}", "CronJob", "embed-nightly",
                     "bursty", start, start + 0.67, 30, 92)
            for slot, (start, tag) in enumerate(((0.0, "abcde"), (6.0, "fghij"), (12.0, "klmno"),
                                                 (18.0, "pqrst")))
        )),
        Gpu("gpu-node-2", "2", A100, (
            Workload("ml", "eval-sweep-4-7xk2p", "Job", "eval-sweep-4", "inference", 13.0, 19.0,
                     38, 64),
        )),
        Gpu("gpu-node-2", "3", A100, (
            # Asked for a GPU "just in case" and never touched it.
            Workload("research", "notebook-bob-0", "StatefulSet", "notebook-bob", "held", 0.0,
                     24.0, 1, 0),
        )),
    ]  # fmt: skip


def _stats(peak: float, idle: float, rng: np.random.Generator) -> FieldStats:
    peak = float(np.clip(peak, 0.0, 100.0))
    p95 = peak * float(rng.uniform(0.85, 0.97))
    return FieldStats(max=peak, p95=p95, mean=p95 * (1 - idle) * 0.8, idle_fraction=idle)


def _ratio(stats: FieldStats, scale: float) -> FieldStats:
    """A DCGM profiling field (a ratio, 0-1) following ``stats`` (a percentage)."""
    return FieldStats(
        stats.max * scale / 100, stats.p95 * scale / 100, stats.mean * scale / 100,
        stats.idle_fraction,
    )  # fmt: skip


def _profile(
    gpu: Gpu,
    work: Workload | None,
    days: tuple[datetime, datetime],  # the first day's start, and today's
    at: datetime,
    rng: np.random.Generator,
) -> tuple[GpuProfile, PodUsage | None]:
    first_day, day_start = days
    hour = (at - day_start).total_seconds() / 3600 % 24
    uuid_text = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{gpu.node}/{gpu.index}')}"
    reasons: tuple[str, ...]
    period: float | None
    if work is None:
        stats = _stats(float(rng.uniform(0, 1)), 1.0, rng)
        fb, job_type, period, reasons = 0.5, "idle", None, ()  # the driver's own 0.5 GiB
    else:
        peak, idle, job_type, period = _behaviour(work, hour, rng)
        stats = _stats(peak, idle, rng)
        fb = work.fb_gib * float(rng.uniform(0.97, 1.0))
        reasons = (f"util idle {idle:.0%} of samples",) if period is None else (
            f"period {period:.0f}s in util", f"owner {work.owner_kind}",
        )  # fmt: skip
    fields = {
        GPU_UTIL: stats,
        MEM_COPY_UTIL: _stats(stats.max * 0.45, stats.idle_fraction, rng),
        FB_USED: FieldStats(fb * _GIB, fb * _GIB, fb * _GIB, 0.0),
        POWER_USAGE: FieldStats(90 + stats.max * 5, 90 + stats.p95 * 5, 90 + stats.mean * 5, 0.0),
        SM_ACTIVE: _ratio(stats, 0.7),
        DRAM_ACTIVE: _ratio(stats, 0.4),
    }
    profile = GpuProfile(
        gpu=gpu.index,
        uuid=uuid_text,
        hostname=gpu.node,
        job_type=job_type,
        period_seconds=period,
        stats=fields,
        namespace=work.namespace if work else None,
        pod=work.pod if work else None,
        confidence=round(float(rng.uniform(0.7, 0.95)), 2),
        reasons=reasons,
        pods=(PodShare(work.namespace, work.pod, 1.0),) if work else (),
        owner_kind=work.owner_kind if work else None,
        owner_name=work.owner_name if work else None,
        first_sample=(at - timedelta(seconds=WINDOW_SECONDS)).timestamp(),
        gpu_model=gpu.model,
        sharing="none",
    )
    if work is None:
        return profile, None
    # A pod there all day lives on across midnight; the others are created anew each day.
    started = first_day if (work.start, work.end) == (0.0, 24.0) else day_start
    started += timedelta(hours=work.start)
    usage = PodUsage(
        work.namespace,
        work.pod,
        gpu.node,
        started,
        (gpu.index,),
        gpu_util_max=stats.max,
        gpu_mem_copy_util_max=fields[MEM_COPY_UTIL].max,
        fb_used_max_mib=fb * _GIB,
        cpu_util_max=float(rng.uniform(80, 400)) if work.job_type != "idle" else 3.0,
        mem_used_max_bytes=float(rng.uniform(8, 40)) * 2**30,
        first_seen=max(started, at - timedelta(seconds=WINDOW_SECONDS)),
        last_seen=at,
        owner_kind=work.owner_kind,
        owner_name=work.owner_name,
    )
    return profile, usage


def _behaviour(
    work: Workload, hour: float, rng: np.random.Generator
) -> tuple[float, float, str, float | None]:
    """(peak %, idle fraction, job type, period) of ``work`` at ``hour``."""
    jitter = float(rng.uniform(0.97, 1.03))
    if work.job_type == "training":
        period = work.period_seconds * jitter if work.period_seconds else None
        return (
            work.util - float(rng.uniform(0, 3)),
            float(rng.uniform(0.05, 0.15)),
            "training",
            period,
        )
    if work.job_type == "inference":  # the day's load: low at night, high in the afternoon
        load = 0.55 + 0.45 * math.sin((hour - 9) / 24 * 2 * math.pi)
        peak = work.util * load + float(rng.normal(0, 4))
        return peak, float(rng.uniform(0, 0.1)), "inference", None
    if work.job_type == "bursty":
        return work.util + float(rng.normal(0, 3)), float(rng.uniform(0.3, 0.7)), "bursty", None
    if work.job_type == "held":
        return 0.0, 1.0, "idle", None
    if 10.0 <= hour < 10.33 or 15.0 <= hour < 15.5:  # a notebook's two sessions of work
        return float(rng.uniform(60, 95)), float(rng.uniform(0.4, 0.8)), "bursty", None
    return work.util * float(rng.uniform(0, 1)), 1.0, "idle", None


def synthetic_days(
    start: datetime, days: int = 1, *, cycle_seconds: float = 300.0, seed: int = 20261129
) -> Iterator[CycleResult]:
    """One cycle per node every ``cycle_seconds`` for ``days`` from ``start``: the same plan
    each day (pods recreated), its figures drawn afresh."""
    rng = np.random.default_rng(seed)
    gpus = _cluster()
    nodes = sorted({gpu.node for gpu in gpus})
    steps = int(days * 86400 / cycle_seconds)
    for step in range(1, steps + 1):
        at = start + timedelta(seconds=step * cycle_seconds)
        day_start = start + timedelta(days=(step * cycle_seconds) // 86400)
        hour = (at - day_start).total_seconds() / 3600
        for node in nodes:
            profiles, pods = [], []
            for gpu in (g for g in gpus if g.node == node):
                work = next((w for w in gpu.workloads if w.start <= hour < w.end), None)
                profile, usage = _profile(gpu, work, (start, day_start), at, rng)
                profiles.append(profile)
                if usage is not None:
                    pods.append(usage)
            yield CycleResult(node, at, WINDOW_SECONDS, profiles, pods)
