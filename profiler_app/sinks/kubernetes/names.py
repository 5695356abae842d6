"""Annotation names (the part after ``<domain>/``) and the limits on what the sink writes.

docs/annotations.md describes each one.
"""

from __future__ import annotations

import re

DEFAULT_HEARTBEAT_SECONDS = 600.0
# Kubernetes rejects objects whose annotations exceed 256 KiB in total, ours included with
# everyone else's. Our share stays far below: at most MAX_GPUS x 9 keys, checked against a budget.
MAX_GPUS = 64
ANNOTATION_BUDGET_BYTES = 32 * 1024

# Node keys, per GPU: <domain>/gpu-<index>-<name>; per MIG instance
# <domain>/gpu-<index>-mig-<GPU_I_ID>-<name>, with its profile (e.g. 1g.10gb) under MIG_PROFILE.
JOB_TYPE, PERIOD, UTIL_MAX, MEM_COPY_UTIL_MAX, FB_USED_MAX = (
    "job-type",
    "period-seconds",
    "util-max",
    "mem-copy-util-max",  # DCGM_FI_DEV_MEM_COPY_UTIL: memory bandwidth, not occupancy
    "fb-used-max-mib",
)
# Why the job type: confidence (0-1, 2 decimals) and the reasons, joined by "; " and cut at a
# reason boundary to REASONS_MAX_CHARS; left out for every GPU when they would take the node
# past ANNOTATION_BUDGET_BYTES.
CONFIDENCE, REASONS = "confidence", "reasons"
REASONS_MAX_CHARS = 160
# What runs on the GPU (profiler_app.profiles.engines): the engine (vllm, torchrun, ...) and the
# framework (pytorch, jax, ...), each present only where known.
ENGINE, FRAMEWORK = "engine", "framework"
MIG_PROFILE = "profile"
# Node key, once per node.
PROFILED_AT = "profiled-at"

# Pod keys: <domain>/<name>.
POD_GPU_UTIL_MAX, POD_GPU_MEM_COPY_UTIL_MAX, POD_CPU_UTIL_MAX, POD_MEM_USED_MAX = (
    "gpu-util-max",
    "gpu-mem-copy-util-max",
    "cpu-util-max",
    "mem-used-max-mib",
)

# Pod keys of its disk and network rates, <direction>-<max|p95>-mib-per-second by direction
# (disk-read, disk-write, network-receive, network-transmit): MiB/s, 1 decimal. The network
# keys read NOT_ATTRIBUTABLE where the pod's traffic cannot be told from the host's.
POD_IO_UNIT = "mib-per-second"
NOT_ATTRIBUTABLE = "not attributable"


def pod_io_name(direction: str, statistic: str) -> str:
    """``disk_read``, ``max`` -> ``disk-read-max-mib-per-second``."""
    return f"{direction.replace('_', '-')}-{statistic}-{POD_IO_UNIT}"


# Names earlier versions wrote for memory-copy utilisation: removed where found (node) or with
# the first write (pods), so a node never shows both.
LEGACY_NODE_NAMES = ("mem-util-max",)
LEGACY_POD_NAMES = ("gpu-mem-util-max",)

_NODE_GPU_NAMES = (
    JOB_TYPE,
    PERIOD,
    UTIL_MAX,
    MEM_COPY_UTIL_MAX,
    FB_USED_MAX,
    CONFIDENCE,
    REASONS,
    ENGINE,
    FRAMEWORK,
    MIG_PROFILE,
    *LEGACY_NODE_NAMES,
)


def owned_node_key(domain: str) -> re.Pattern[str]:
    """Matches the node annotation keys this profiler owns under ``domain``."""
    gpu_names = "|".join(re.escape(name) for name in _NODE_GPU_NAMES)
    return re.compile(
        rf"^{re.escape(domain)}/(gpu-[A-Za-z0-9]+(-mig-[0-9]+)?-({gpu_names})|{PROFILED_AT})$"
    )
