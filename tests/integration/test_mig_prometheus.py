"""MIG instances against a real Prometheus: the regression test that they no longer merge.

The backfill is shaped as dcgm-exporter exports a MIG node (dcgm-exporter#216, #317): one GPU
UUID and ``gpu`` index for seven instances told apart by ``GPU_I_ID`` 1-7 and ``GPU_I_PROFILE``,
no ``DCGM_FI_DEV_GPU_UTIL``, with ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``,
``DCGM_FI_PROF_DRAM_ACTIVE`` (ratios) and ``DCGM_FI_DEV_FB_USED`` per instance; a whole GPU
beside them keeps ``GPU_UTIL``. Before, the seven collapsed into one profile holding the
maximum of all seven and the pod of one of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pytest

from profiler_app.cli import main
from profiler_app.commands.options import DEFAULT_FIELDS
from profiler_app.core.model import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MEM_COPY_UTIL,
    CycleResult,
)
from profiler_app.profiles.build import build_profiles
from profiler_app.sinks.kubernetes import node_annotations
from profiler_app.sources.prometheus import PrometheusSource
from tests.support import signals
from tests.support.dcgm import OpenMetricsBuilder, sample_times
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.integration

NODE = "mig-node"
UUID = "GPU-5d3c8a51-6a0e-4a1f-9c35-a100a100a100"
STEP = 10.0
POINTS = 180  # 30 minutes
WINDOW = "30m"


@dataclass(frozen=True)
class Instance:
    gi: int
    role: str  # training, inference or idle
    pod: str | None
    fb_mib: float


INSTANCES = (
    Instance(1, "training", "train-a", 9000.0),
    Instance(2, "inference", "serve-b", 7000.0),
    Instance(3, "idle", "holder-c", 8000.0),  # memory held, compute idle
    *(Instance(gi, "idle", None, 0.0) for gi in range(4, 8)),
)


def instance_labels(instance: Instance) -> dict[str, str]:
    labels = {
        "gpu": "0",
        "UUID": UUID,
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": NODE,
        "GPU_I_PROFILE": "1g.10gb",
        "GPU_I_ID": str(instance.gi),
    }
    if instance.pod:
        labels |= {"namespace": "ml", "pod": instance.pod, "container": "main"}
    return labels


def engine_activity(instance: Instance, rng: np.random.Generator) -> np.ndarray:
    if instance.role == "training":
        return signals.square(POINTS, 8, rng, duty=0.6) / 100.0
    if instance.role == "inference":
        return np.clip(0.5 + rng.normal(0, 0.03, POINTS), 0, 1)
    return np.zeros(POINTS)


def mig_backfill() -> str:
    rng = np.random.default_rng(22)
    times = sample_times(POINTS, STEP)
    builder = OpenMetricsBuilder()
    for instance in INSTANCES:
        labels = instance_labels(instance)
        activity = engine_activity(instance, rng)
        builder.add(GR_ENGINE_ACTIVE, labels, activity, times)
        builder.add(DRAM_ACTIVE, labels, activity * 0.3, times)
        builder.add(FB_USED, labels, np.full(POINTS, instance.fb_mib), times)
    whole = {
        "gpu": "1",
        "UUID": "GPU-whole-1",
        "device": "nvidia1",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": NODE,
    }
    builder.add(GPU_UTIL, whole, np.full(POINTS, 97.0), times)
    builder.add(MEM_COPY_UTIL, whole, np.full(POINTS, 40.0), times)
    builder.add(FB_USED, whole, np.full(POINTS, 60000.0), times)
    return builder.text()


@pytest.fixture(scope="module")
def mig_prometheus() -> Iterator[str]:
    with PrometheusServer(mig_backfill()) as server:
        yield server.url


def analyze(capsys: pytest.CaptureFixture[str], url: str, *arguments: str) -> str:
    status = main(
        ["analyze", "--prometheus-url", url, "--node", NODE, "--window", WINDOW, *arguments]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return captured.out


def test_seven_mig_instances_are_seven_profiles_in_json(
    capsys: pytest.CaptureFixture[str], mig_prometheus: str
) -> None:
    records = json.loads(analyze(capsys, mig_prometheus, "--output", "json"))["gpus"]
    instances = [record for record in records if record["mig_instance"]]
    assert [record["mig_instance"] for record in instances] == [str(gi) for gi in range(1, 8)]
    assert {record["uuid"] for record in instances} == {UUID}
    by_id = {int(record["mig_instance"]): record for record in instances}
    assert by_id[1]["job_type"] == "training"
    assert by_id[1]["pod"] == "train-a"
    assert by_id[2]["job_type"] in ("inference", "bursty")
    assert by_id[2]["pod"] == "serve-b"
    assert [by_id[gi]["job_type"] for gi in range(3, 8)] == ["idle"] * 5
    assert any(reason.startswith("memory held 8000") for reason in by_id[3]["reasons"])
    # Each instance's own peaks, not the maximum of all seven.
    assert [by_id[gi]["stats"][FB_USED]["max"] for gi in range(1, 8)] == [
        instance.fb_mib for instance in INSTANCES
    ]
    assert by_id[4]["stats"][GR_ENGINE_ACTIVE]["max"] == 0.0
    assert GPU_UTIL not in by_id[1]["stats"]
    assert {record["mig_profile"] for record in instances} == {"1g.10gb"}
    whole = [record for record in records if not record["mig_instance"]]
    assert [(record["gpu"], record["job_type"]) for record in whole] == [("1", "inference")]


def test_the_table_names_each_instance(
    capsys: pytest.CaptureFixture[str], mig_prometheus: str
) -> None:
    table = analyze(capsys, mig_prometheus).splitlines()
    names = [line.split()[1] for line in table[1:]]
    assert names == [f"0-mig-{gi}" for gi in range(1, 8)] + ["1"]


def test_the_daemons_source_gives_one_annotation_set_per_instance(mig_prometheus: str) -> None:
    """The daemon's path: its source (default fields, GPU_UTIL of MIG absent), the profiles,
    the node annotations."""
    source = PrometheusSource(
        mig_prometheus, NODE, fields=DEFAULT_FIELDS, optional_fields=DEFAULT_FIELDS[1:]
    )
    try:
        profiles = build_profiles(source.read(1800.0))
    finally:
        source.close()
    result = CycleResult(NODE, datetime.now(UTC), 1800.0, profiles)
    annotations = node_annotations(result, "ai.centaurus.io")
    job_types = {key: value for key, value in annotations.items() if key.endswith("-job-type")}
    assert len(job_types) == 8
    assert job_types["ai.centaurus.io/gpu-0-mig-1-job-type"] == "training"
    assert annotations["ai.centaurus.io/gpu-0-mig-3-fb-used-max-mib"] == "8000"
    assert annotations["ai.centaurus.io/gpu-0-mig-7-profile"] == "1g.10gb"
    assert annotations["ai.centaurus.io/gpu-1-util-max"] == "97"
    util = {gi: annotations[f"ai.centaurus.io/gpu-0-mig-{gi}-util-max"] for gi in (1, 4)}
    assert int(util[1]) > 50
    assert util[4] == "0"


def test_a_node_without_any_series_is_still_a_clear_error(
    capsys: pytest.CaptureFixture[str], mig_prometheus: str
) -> None:
    status = main(
        [
            "analyze",
            "--prometheus-url",
            mig_prometheus,
            "--node",
            "no-such-node",
            "--window",
            WINDOW,
        ]
    )
    assert status == 2
    assert "no series for Hostname=no-such-node" in capsys.readouterr().err
