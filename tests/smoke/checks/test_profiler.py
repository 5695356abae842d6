"""gpu-profiler annotates every GPU node, and keeps doing so."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.smoke.checks.cluster import Cluster, eventually, fail_on
from tests.smoke.checks.layout import PROFILED_AT, SmokeSettings
from tests.smoke.checks.scheduling import annotations, gpu_count, gpu_nodes, name

pytestmark = pytest.mark.smoke


def _age_seconds(stamp: str) -> float | None:
    try:
        moment = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return (datetime.now(UTC) - moment).total_seconds()


def test_every_gpu_node_has_fresh_profiler_annotations(
    cluster: Cluster, settings: SmokeSettings
) -> None:
    stamp_key = settings.annotation(PROFILED_AT)
    limit = settings.annotation_max_age_seconds
    profiler = settings.daemon_sets()["profiler"]

    def probe() -> list[str]:
        problems = []
        for node in gpu_nodes(cluster):
            found = annotations(node)
            stamp = found.get(stamp_key)
            if stamp is None:
                problems.append(
                    f"{name(node)} has no {stamp_key}: the profiler has not published there "
                    f"(is {profiler}'s pod running on it? its log says why)"
                )
                continue
            age = _age_seconds(stamp)
            if age is None or age > limit:
                shown = "unreadable" if age is None else f"{age / 60:.0f} min old"
                problems.append(
                    f"{name(node)}: {stamp_key}={stamp} is {shown} (limit {limit / 60:.0f} min): "
                    f"the profiler there is stopped, stuck, or cannot patch the node; read the "
                    f"log of {profiler}'s pod on it"
                )
            job_types = [key for key in found if key.endswith("-job-type")]
            gpus = gpu_count(node, "capacity")
            if gpus and len(job_types) < gpus:
                problems.append(
                    f"{name(node)}: job types for {len(job_types)} of its {gpus} GPUs: the "
                    "profiler reads fewer GPUs from Prometheus than the node has"
                )
        return problems

    fail_on(
        eventually(probe, settings.timeout_seconds),
        "GPU nodes lack fresh profiler annotations",
    )
