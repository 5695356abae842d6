"""MIG instances in build_profiles: each instance one GPU (node, UUID, GPU_I_ID), classified on
GR_ENGINE_ACTIVE in percent (GPU_UTIL does not exist on MIG), DRAM_ACTIVE for memory bandwidth,
its own framebuffer, no power; values relative to the instance (DCGM#138); SM_ACTIVE capped at 1
(DCGM#152)."""

from __future__ import annotations

import numpy as np
import pytest

from profiler_app.core.model import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MEM_COPY_UTIL,
    POWER_USAGE,
    SM_ACTIVE,
    SeriesMatrix,
)
from profiler_app.profiles.build import build_profiles
from profiler_app.sinks import field_stat
from tests.support import signals

STEP = 10.0
N = 180
UUID = "GPU-7f3e0b9a-0000-4000-8000-a100a100a100"
PROFILES = {
    "1": "1g.10gb",
    "2": "1g.10gb",
    "3": "1g.10gb",
    "4": "1g.10gb",
    "5": "1g.10gb",
    "6": "1g.10gb",
    "7": "1g.10gb",
}


def instance(gi: str, pod: str | None = None) -> dict[str, str]:
    labels = {
        "Hostname": "node-a",
        "gpu": "0",
        "UUID": UUID,
        "modelName": "NVIDIA A100-SXM4-80GB",
        "GPU_I_ID": gi,
        "GPU_I_PROFILE": PROFILES.get(gi, "3g.40gb"),
    }
    if pod:
        labels |= {"namespace": "ml", "pod": pod}
    return labels


def matrix(field: str, rows: list[tuple[dict[str, str], np.ndarray]]) -> SeriesMatrix:
    timestamps = STEP * np.arange(N, dtype=np.float64)
    return SeriesMatrix(
        field,
        [dict(labels) for labels, _ in rows],
        timestamps,
        np.vstack([r for _, r in rows]),
        STEP,
    )


def empty(field: str) -> SeriesMatrix:
    timestamps = STEP * np.arange(N, dtype=np.float64)
    return SeriesMatrix(field, [], timestamps, np.empty((0, N)), STEP)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def seven_instances(rng: np.random.Generator) -> list[SeriesMatrix]:
    """Instance 1 trains (a loop), 2 serves steadily, 3-7 are idle; 3 holds memory."""
    engine, dram, fb = [], [], []
    for gi in map(str, range(1, 8)):
        if gi == "1":
            ratio = signals.square(N, 12, rng, duty=0.6) / 100.0
        elif gi == "2":
            ratio = np.clip(0.55 + rng.normal(0, 0.03, N), 0, 1)
        else:
            ratio = np.zeros(N)
        pod = {"1": "train", "2": "serve", "3": "holder"}.get(gi)
        engine.append((instance(gi, pod), ratio))
        dram.append((instance(gi, pod), ratio * 0.4))
        fb.append((instance(gi, pod), np.full(N, 9000.0 if gi in "123" else 0.0)))
    return [
        empty(GPU_UTIL),
        matrix(GR_ENGINE_ACTIVE, engine),
        matrix(DRAM_ACTIVE, dram),
        matrix(FB_USED, fb),
    ]


def test_seven_instances_of_one_uuid_are_seven_profiles(rng: np.random.Generator) -> None:
    profiles = build_profiles(seven_instances(rng))
    assert [p.mig_instance for p in profiles] == [str(gi) for gi in range(1, 8)]
    assert {p.uuid for p in profiles} == {UUID}
    assert [p.mig_profile for p in profiles] == ["1g.10gb"] * 7
    assert profiles[0].job_type == "training"
    assert profiles[0].pod == "train"
    assert profiles[1].job_type != "idle"
    assert [p.job_type for p in profiles[2:]] == ["idle"] * 5
    assert "memory held 9000 MiB" in profiles[2].reasons
    assert profiles[3].pod is None
    assert {p.gpu_model for p in profiles} == {"NVIDIA A100-SXM4-80GB"}


def test_an_instance_is_read_on_its_own_fields_in_percent(rng: np.random.Generator) -> None:
    serving = build_profiles(seven_instances(rng))[1]
    assert serving.util_field == GR_ENGINE_ACTIVE
    assert serving.mem_field == DRAM_ACTIVE
    assert GPU_UTIL not in serving.stats
    # Stats keep the field's own unit (a ratio); utilisation as the sinks read it is percent.
    assert serving.stats[GR_ENGINE_ACTIVE].mean == pytest.approx(0.55, abs=0.02)
    assert field_stat(serving, GPU_UTIL, "mean") == pytest.approx(55.0, abs=2.0)
    assert field_stat(serving, MEM_COPY_UTIL, "mean") == pytest.approx(22.0, abs=1.0)
    assert field_stat(serving, FB_USED) == 9000.0


def test_gpu_util_reading_zero_on_instances_is_replaced_and_power_is_not_used(
    rng: np.random.Generator,
) -> None:
    """dcgm-exporter may export GPU_UTIL as 0 on MIG instances (dcgm-exporter#216), and power
    is the parent GPU's: neither may make a busy instance idle or an idle one busy."""
    matrices = seven_instances(rng)
    zeros = [(instance(str(gi)), np.zeros(N)) for gi in range(1, 8)]
    power = [(instance(str(gi)), np.full(N, 380.0)) for gi in range(1, 8)]
    profiles = build_profiles([matrix(GPU_UTIL, zeros), *matrices[1:], matrix(POWER_USAGE, power)])
    assert len(profiles) == 7
    assert profiles[0].job_type == "training"
    assert [p.job_type for p in profiles[2:]] == ["idle"] * 5
    assert all(POWER_USAGE not in p.stats for p in profiles)


def test_instance_relative_values_are_not_rescaled_by_the_instance_size(
    rng: np.random.Generator,
) -> None:
    """DCGM#138: one compute instance on a 3g instance reads at most 33 %: that is the share of
    the instance it keeps busy, and it is classified as it reads (busy, not idle; not 100 %)."""
    steady = np.clip(0.33 + rng.normal(0, 0.01, N), 0, 1)
    labels = instance("1", "serve") | {"GPU_I_PROFILE": "3g.40gb"}
    profile = build_profiles([empty(GPU_UTIL), matrix(GR_ENGINE_ACTIVE, [(labels, steady)])])[0]
    assert profile.job_type != "idle"
    assert field_stat(profile, GPU_UTIL, "max") == pytest.approx(steady.max() * 100)


def test_sm_active_above_one_on_an_instance_is_capped(rng: np.random.Generator) -> None:
    """DCGM#152: SM_ACTIVE reads up to 1.3 on MIG instances; the classifier sees at most 1."""
    matrices = seven_instances(rng)
    sm = [(instance(str(gi)), np.full(N, 1.3)) for gi in range(1, 8)]
    capped = build_profiles([*matrices, matrix(SM_ACTIVE, sm)])
    plain = build_profiles([*matrices, matrix(SM_ACTIVE, [(lab, np.ones(N)) for lab, _ in sm])])
    assert [p.job_type for p in capped] == [p.job_type for p in plain]


def test_whole_gpus_beside_instances_keep_gpu_util(rng: np.random.Generator) -> None:
    whole = {"Hostname": "node-a", "gpu": "1", "UUID": "GPU-whole"}
    matrices = seven_instances(rng)
    util = matrix(GPU_UTIL, [(whole, np.full(N, 90.0))])
    profiles = build_profiles([util, *matrices[1:]])
    assert [(p.gpu, p.mig_instance) for p in profiles][-1] == ("1", "")
    assert profiles[-1].util_field == GPU_UTIL
    assert field_stat(profiles[-1], GPU_UTIL) == 90.0
