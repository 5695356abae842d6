"""Hand-made cycle results for sink tests."""

from __future__ import annotations

from datetime import UTC, datetime

from profiler_app.core.model import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MEM_COPY_UTIL,
    CycleResult,
    FieldStats,
    GpuProfile,
    PodUsage,
)

AT = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)
REASONS = {
    "training": ("period 12s in util", "owner PyTorchJob"),
    "idle": ("util idle 100% of samples",),
    "bursty": ("util idle 60% of samples", "no loop"),
    "inference": ("util idle 0% of samples", "no loop"),
}


def gpu_profile(
    gpu: str,
    job_type: str,
    *,
    period: float | None = None,
    util: tuple[float, float, float, float] = (90.0, 85.0, 60.0, 0.1),
    mem_util_max: float = 40.0,
    fb_used_max: float = 30_000.0,
    namespace: str | None = None,
    pod: str | None = None,
    hostname: str = "node-a",
    confidence: float | None = 0.9,
    reasons: tuple[str, ...] | None = None,
    engine: str | None = None,
    framework: str | None = None,
) -> GpuProfile:
    """A profile with GPU_UTIL stats ``util`` = (max, p95, mean, idle fraction); its reasons
    default to typical ones for its job type."""
    return GpuProfile(
        gpu=gpu,
        uuid=f"GPU-{gpu}-0000",
        hostname=hostname,
        job_type=job_type,
        period_seconds=period,
        stats={
            GPU_UTIL: FieldStats(*util),
            MEM_COPY_UTIL: FieldStats(mem_util_max, mem_util_max, mem_util_max / 2, 0.0),
            FB_USED: FieldStats(fb_used_max, fb_used_max, fb_used_max, 0.0),
        },
        namespace=namespace,
        pod=pod,
        confidence=confidence,
        reasons=REASONS.get(job_type, ()) if reasons is None else reasons,
        basis={"training": "util-loop", "idle": "idle"}.get(job_type, "steady"),
        engine=engine,
        framework=framework,
    )


def sample_cycle(node: str = "node-a") -> CycleResult:
    """Two GPUs: a training pod on GPU 0 (torchrun, PyTorch), nothing on GPU 1; host readings
    and one pod."""
    return CycleResult(
        node=node,
        at=AT,
        window_seconds=1800.0,
        gpus=[
            gpu_profile(
                "0",
                "training",
                period=12.5,
                namespace="ml",
                pod="trainer-0",
                engine="torchrun",
                framework="pytorch",
            ),
            gpu_profile(
                "1",
                "idle",
                util=(0.0, 0.0, 0.0, 1.0),
                mem_util_max=0,
                fb_used_max=0,
                confidence=0.95,
            ),
        ],
        pods=[
            PodUsage(
                namespace="ml",
                pod="trainer-0",
                node=node,
                start_time=AT,
                gpus=("0",),
                gpu_util_max=90.0,
                gpu_mem_copy_util_max=40.0,
                fb_used_max_mib=30_000.0,
                cpu_util_max=250.0,
                mem_used_max_bytes=8 * 2**30,
            )
        ],
        host={"cpu_percent": 12.5, "memory_percent": 40.0, "disk_used_percent": 71.0},
    )


def mig_profile(gpu: str, instance: str, job_type: str, *, util: float = 0.5) -> GpuProfile:
    """A MIG instance (``GPU_I_ID`` ``instance``, 1g.10gb) of GPU ``gpu`` on node-a: its
    utilisation GR_ENGINE_ACTIVE ``util`` (a ratio), its bandwidth DRAM_ACTIVE, 4 GiB held."""
    return GpuProfile(
        gpu=gpu,
        uuid=f"GPU-{gpu}-0000",
        hostname="node-a",
        job_type=job_type,
        period_seconds=None,
        stats={
            GR_ENGINE_ACTIVE: FieldStats(util, util, util / 2, 0.0),
            DRAM_ACTIVE: FieldStats(util / 2, util / 2, util / 4, 0.0),
            FB_USED: FieldStats(4096.0, 4096.0, 4096.0, 0.0),
        },
        confidence=0.8,
        reasons=("steady",),
        mig_instance=instance,
        mig_profile="1g.10gb",
        gpu_model="NVIDIA A100-SXM4-80GB",
        util_field=GR_ENGINE_ACTIVE,
        mem_field=DRAM_ACTIVE,
    )
