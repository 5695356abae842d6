"""Right-sizing advice (profiler_app/reports/rightsizing): the MIG profile tables, the needs and
verdicts, golden recommendations per GPU model worked out by hand from the tables, a property
test over random measurements, NVML's table read through a stand-in pynvml (a test double with
NVML's function and field names), and the output rows."""

from __future__ import annotations

import csv
import io
import itertools
import json
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler_app.reports.rightsizing import (
    MODELS,
    GpuModel,
    Verdict,
    WorkloadUsage,
    model_for,
    recommend,
)
from profiler_app.reports.rightsizing.advice import (
    MAX_MPS_CLIENTS,
    Needs,
    holds,
    mps_clients,
    needs_of,
    peak_inside,
    smallest_fitting,
)
from profiler_app.reports.rightsizing.defaults import RIGHTSIZE_METRIC
from profiler_app.reports.rightsizing.output import (
    COLUMNS,
    RIGHTSIZE_LABELS,
    advice_record,
    csv_text,
    metric_samples,
    table_rows,
)
from profiler_app.reports.rightsizing.profiles import (
    A100_40GB,
    A100_80GB,
    H100_PCIE_80GB,
    H100_SXM5_80GB,
    H200_141GB,
    profiles_from_nvml,
)

DAY = 24 * 3600.0


def usage(**changes: Any) -> WorkloadUsage:
    """A steady workload with two days of history whose cycle was seen."""
    base = WorkloadUsage(
        namespace="ml",
        workload="server",
        gpu_model="NVIDIA H100 80GB HBM3",
        peak_fb_mib=9 * 1024.0,
        sm_active_p95=0.20,
        sm_active_p50=0.15,
        dram_active_p95=0.05,
        active_fraction=0.9,
        history_seconds=2 * DAY,
        cycle_seen=True,
    )
    return replace(base, **changes)


# -- the worked example of docs/sharing.md ------------------------------------------------------


@pytest.mark.parametrize(
    "product", ["NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "H100-SXM5-80GB"]
)
def test_the_docs_worked_example(product: str) -> None:
    """9 GiB framebuffer peak and 20 % SM activity on an H100: 10.4 GiB and 26.4 SMs, so
    2g.20gb (1g.10gb is short of memory, 1g.20gb of SMs)."""
    model = model_for(product)
    assert model is H100_SXM5_80GB
    advice = recommend(usage(gpu_model=product), model)
    assert advice.needs is not None
    assert round(advice.needs.memory_gib, 2) == 10.35
    assert round(advice.needs.sms, 1) == 26.4
    assert (advice.verdict, advice.label) == (Verdict.MIG, "2g.20gb")
    assert advice.reason.startswith("needs 10.4 GiB, 26.4 SMs and 5% of the memory bandwidth")
    one_g = [model.profile("1g.10gb"), model.profile("1g.20gb")]
    assert [p is not None and holds(p, advice.needs) for p in one_g] == [False, False]


# -- the tables ---------------------------------------------------------------------------------


def test_the_issues_h100_figures_are_the_tables() -> None:
    """The sizes the issue quoted for H100 SXM 80GB, as nvidia-smi mig -lgip lists them."""
    expected = {
        "1g.10gb": (9.75, 16),
        "1g.20gb": (19.62, 26),
        "2g.20gb": (19.62, 32),
        "3g.40gb": (39.5, 60),
        "4g.40gb": (39.5, 64),
        "7g.80gb": (79.25, 132),
    }
    assert {p.name: (p.memory_gib, p.sms) for p in H100_SXM5_80GB.profiles} == expected


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_table_follows_the_mig_user_guides_geometry(model: GpuModel) -> None:
    """Per the MIG user guide: 1/8 to 8/8 of the memory and 1/7 to 7/7 of the SMs; 7, 4, 3,
    2, 1 instances of the 1g, 1g-with-two-memory-slices, 2g, 3g and 4g/7g profiles; the name's
    compute slices are the profile's; bigger profiles never get less."""
    instances = {(1, 1): 7, (1, 2): 4, (2, 2): 3, (3, 4): 2, (4, 4): 1, (7, 8): 1}
    for profile in model.profiles:
        assert instances[(profile.compute_slices, profile.memory_slices)] == profile.instances
        assert profile.name.startswith(f"{profile.compute_slices}g.")
        assert profile.memory_gib <= int(profile.name.split(".")[1].removesuffix("gb"))
    ordered = sorted(model.profiles, key=lambda p: p.size)
    for smaller, bigger in itertools.pairwise(ordered):
        assert bigger.sms >= smaller.sms
        assert bigger.memory_gib >= smaller.memory_gib
    assert model.whole_gpu_profile().memory_slices == 8
    assert model.whole_gpu_profile().sms <= model.sms


def test_only_derived_tables_say_so() -> None:
    assert [m.key for m in MODELS if not m.measured] == ["H200-141GB"]
    advice = recommend(usage(gpu_model="NVIDIA H200"), H200_141GB)
    assert advice.notes
    assert "derived" in advice.notes[0]
    assert recommend(usage(), H100_SXM5_80GB).notes == ()


@pytest.mark.parametrize("product", ["NVIDIA A10G", "NVIDIA L4", "Tesla T4"])
def test_gpus_without_mig_have_no_table(product: str) -> None:
    assert model_for(product) is None


# -- golden recommendations per model, worked out by hand from the tables -----------------------

# (peak GiB, p95 SM activity, p95 DRAM activity)
WORKLOADS = {
    "small": (3.0, 0.10, 0.05),
    "compute": (8.0, 0.20, 0.10),
    "medium": (12.0, 0.30, 0.10),
    "big": (30.0, 0.30, 0.10),
    "bandwidth": (3.0, 0.10, 0.40),
}
GOLDEN = {
    # A100 40GB (108 SMs): small 3.45 GiB/10.8 SMs; compute 9.2/21.6 (1g.10gb has 14 SMs);
    # medium 13.8/32.4; big 34.5 GiB only fits the whole GPU; bandwidth 40 % needs 4/8 memory.
    "A100-40GB": {
        "small": "1g.5gb",
        "compute": "2g.10gb",
        "medium": "3g.20gb",
        "big": "full-gpu",
        "bandwidth": "3g.20gb",
    },
    "A100-80GB": {
        "small": "1g.10gb",
        "compute": "2g.20gb",
        "medium": "3g.40gb",
        "big": "3g.40gb",
        "bandwidth": "3g.40gb",
    },
    # H100 SXM5 (132 SMs): compute needs 26.4 SMs: 1g.20gb's 26 fall short.
    "H100-SXM5-80GB": {
        "small": "1g.10gb",
        "compute": "2g.20gb",
        "medium": "3g.40gb",
        "big": "3g.40gb",
        "bandwidth": "3g.40gb",
    },
    # H100 PCIe (114 SMs): medium needs 34.2 SMs, 2g.20gb has 30.
    "H100-PCIe-80GB": {
        "small": "1g.10gb",
        "compute": "2g.20gb",
        "medium": "3g.40gb",
        "big": "3g.40gb",
        "bandwidth": "3g.40gb",
    },
    "H200-141GB": {
        "small": "1g.18gb",
        "compute": "2g.35gb",
        "medium": "3g.71gb",
        "big": "3g.71gb",
        "bandwidth": "3g.71gb",
    },
}


@pytest.mark.parametrize(
    ("model_key", "workload"),
    [(model, workload) for model in GOLDEN for workload in WORKLOADS],
)
def test_golden_recommendations(model_key: str, workload: str) -> None:
    model = model_for(model_key)
    assert model is not None
    peak, sm, dram = WORKLOADS[workload]
    advice = recommend(
        usage(
            gpu_model=model.products[0],
            peak_fb_mib=peak * 1024,
            sm_active_p95=sm,
            sm_active_p50=sm * 0.8,
            dram_active_p95=dram,
        ),
        model,
    )
    assert advice.label == GOLDEN[model_key][workload], advice.reason


def test_a_workload_on_a_mig_instance_is_measured_against_that_instance() -> None:
    """SM and DRAM activity on a 3g.40gb are relative to its 60 SMs and 4/8 of the memory: 50 %
    SM is 30 SMs, 30 % DRAM is 15 % of the GPU's bandwidth."""
    advice = recommend(
        usage(current_profile="3g.40gb", sm_active_p95=0.5, dram_active_p95=0.3, peak_fb_mib=10240),
        H100_SXM5_80GB,
    )
    assert advice.needs is not None
    assert (advice.needs.sms, advice.needs.memory_fraction) == (30.0, 0.15)
    assert advice.label == "2g.20gb"
    with pytest.raises(ValueError, match=r"profile 3g\.20gb is not one of H100-SXM5-80GB"):
        recommend(usage(current_profile="3g.20gb"), H100_SXM5_80GB)


def test_sm_activity_above_one_on_mig_counts_as_one() -> None:
    """DCGM#152: SM_ACTIVE can read above 1 on MIG instances."""
    advice = recommend(usage(current_profile="1g.10gb", sm_active_p95=1.7), H100_SXM5_80GB)
    assert advice.needs is not None
    assert advice.needs.sms == 16


# -- the other verdicts -------------------------------------------------------------------------


def test_mostly_idle_and_bursty_work_is_a_time_slicing_candidate() -> None:
    idle = recommend(usage(active_fraction=0.1), A100_80GB)
    assert (idle.verdict, idle.label) == (Verdict.TIME_SLICING, "time-slicing")
    assert idle.reason == "active 10% of the time"
    assert idle.smallest_fitting is not None  # still said: what a MIG slice would need
    bursty = recommend(usage(sm_active_p95=0.6, sm_active_p50=0.05, active_fraction=0.5), A100_80GB)
    assert bursty.verdict is Verdict.TIME_SLICING
    assert bursty.reason == "bursty: p95 SM activity 60%, median 5%"


def test_steady_low_work_without_mig_is_an_mps_candidate() -> None:
    """An A10G (no MIG, 22 GiB): 2 GiB at a steady 20 % SM activity is one of five clients,
    whose 4.4 GiB share holds its 2.3 GiB."""
    advice = recommend(usage(gpu_model="NVIDIA A10G", peak_fb_mib=2048), None, gpu_memory_gib=22.0)
    assert (advice.verdict, advice.label, advice.mps_clients) == (Verdict.MPS, "mps", 5)
    assert (
        advice.reason == "steady, p95 SM activity 20%: one of 5 clients, 2.3 GiB of a 4.4 GiB share"
    )
    too_big = recommend(usage(gpu_model="NVIDIA A10G", peak_fb_mib=6144), None, gpu_memory_gib=22.0)
    assert too_big.verdict is Verdict.FULL_GPU
    unknown_memory = recommend(usage(gpu_model="NVIDIA A10G", peak_fb_mib=2048), None)
    assert unknown_memory.verdict is Verdict.FULL_GPU


def test_work_that_needs_the_whole_gpu_keeps_it() -> None:
    heavy = recommend(
        usage(peak_fb_mib=60 * 1024, sm_active_p95=0.9, sm_active_p50=0.8), H100_SXM5_80GB
    )
    assert (heavy.verdict, heavy.label) == (Verdict.FULL_GPU, "full-gpu")
    assert heavy.reason == "only the whole-GPU profile 7g.80gb holds it"
    too_big = recommend(
        usage(peak_fb_mib=90 * 1024, sm_active_p95=0.9, sm_active_p50=0.8), H100_SXM5_80GB
    )
    assert too_big.smallest_fitting is None
    assert too_big.reason.startswith("no H100-SXM5-80GB MIG profile holds 103.5 GiB")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"history_seconds": 10 * 3600}, "10.0 h of history, advice needs at least 24 h"),
        ({"cycle_seen": False}, "its iteration cycle or traffic peak has not been seen yet"),
    ],
)
def test_no_advice_without_enough_history(changes: dict[str, Any], reason: str) -> None:
    advice = recommend(usage(**changes), H100_SXM5_80GB)
    assert (advice.verdict, advice.reason, advice.label) == (Verdict.NOT_ENOUGH_HISTORY, reason, "")
    assert advice.needs is None


def test_a_peak_must_rise_and_fall_inside_the_window() -> None:
    assert peak_inside([1, 3, 9, 4, 2])
    assert not peak_inside([9, 3, 2, 1, 1])  # maybe the tail of a bigger one before the window
    assert not peak_inside([1, 2, 3, 4, 9])  # maybe still rising
    assert not peak_inside([5, 5, 5, 5])
    assert peak_inside([1, float("nan"), 8, 2])
    assert not peak_inside([3])


def test_headroom_is_a_choice() -> None:
    tight = recommend(usage(peak_fb_mib=9.5 * 1024, sm_active_p95=0.1), H100_SXM5_80GB, headroom=0)
    assert tight.label == "1g.10gb"
    default = recommend(usage(peak_fb_mib=9.5 * 1024, sm_active_p95=0.1), H100_SXM5_80GB)
    assert default.label == "1g.20gb"
    with pytest.raises(ValueError, match="headroom must be at least 0"):
        recommend(usage(), H100_SXM5_80GB, headroom=-0.1)


# -- the property --------------------------------------------------------------------------------

ratios = st.floats(min_value=0.0, max_value=1.5, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    peak_gib=st.floats(min_value=0.0, max_value=160.0, allow_nan=False),
    sm=ratios,
    dram=ratios,
    active=st.floats(min_value=0.0, max_value=1.0),
    headroom=st.sampled_from([0.0, 0.15, 0.3]),
    current=st.integers(min_value=-1, max_value=5),
)
def test_every_recommended_profile_exists_and_holds_the_peaks_with_headroom(
    *,
    model: GpuModel,
    peak_gib: float,
    sm: float,
    dram: float,
    active: float,
    headroom: float,
    current: int,
) -> None:
    on = model.profiles[current].name if 0 <= current < len(model.profiles) else None
    measured = usage(
        gpu_model=model.products[0],
        peak_fb_mib=peak_gib * 1024,
        sm_active_p95=sm,
        sm_active_p50=sm / 2,
        dram_active_p95=dram,
        active_fraction=active,
        current_profile=on,
    )
    advice = recommend(measured, model, headroom=headroom)
    needs = needs_of(measured, model, headroom)
    assert advice.needs == needs
    for profile in (advice.profile, advice.smallest_fitting):
        if profile is None:
            continue
        assert profile in model.profiles
        assert profile.memory_gib >= peak_gib * (1 + headroom)
        assert profile.sms >= min(sm, 1.0) * (model.profile(on).sms if on else model.sms)
        assert holds(profile, needs)
        assert all(not holds(p, needs) or p.size >= profile.size for p in model.profiles)
    if advice.verdict is Verdict.MIG:
        assert advice.profile == smallest_fitting(model, needs)
        assert advice.profile != model.whole_gpu_profile()
    else:
        assert advice.profile is None


# -- NVML's table at run time -------------------------------------------------------------------


class NVMLError(Exception):
    """pynvml's error type (NVML_ERROR_NOT_SUPPORTED for a profile the GPU lacks)."""


@dataclass
class ProfileInfo:
    """NVML's nvmlGpuInstanceProfileInfo_v2_t, its fields as pynvml names them."""

    sliceCount: int  # noqa: N815
    instanceCount: int  # noqa: N815
    multiprocessorCount: int  # noqa: N815
    memorySizeMB: int  # noqa: N815
    name: bytes


class StandInNvml:
    """TEST DOUBLE for pynvml's two calls: the H100 SXM5 of nvidia-smi mig -lgip, by NVML's
    profile ids (NVML_GPU_INSTANCE_PROFILE_*), and NOT_SUPPORTED for the rest."""

    NVMLError = NVMLError

    def __init__(self, profiles: dict[int, ProfileInfo], name: str) -> None:
        self.profiles = profiles
        self.name = name
        self.asked: list[int] = []

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int) -> ProfileInfo:
        assert handle == "handle-0"
        self.asked.append(profile)
        if profile not in self.profiles:
            raise NVMLError("Not Supported")
        return self.profiles[profile]

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        return self.name.encode()


H100_NVML = {
    0x0: ProfileInfo(1, 7, 16, 9984, b"MIG 1g.10gb"),
    0x7: ProfileInfo(1, 1, 16, 9984, b"MIG 1g.10gb+me"),  # media extensions: not a size
    0x9: ProfileInfo(1, 4, 26, 20096, b"MIG 1g.20gb"),
    0x1: ProfileInfo(2, 3, 32, 20096, b"MIG 2g.20gb"),
    0x2: ProfileInfo(3, 2, 60, 40448, b"MIG 3g.40gb"),
    0x3: ProfileInfo(4, 1, 64, 40448, b"MIG 4g.40gb"),
    0x4: ProfileInfo(7, 1, 132, 81152, b"MIG 7g.80gb"),
}


def test_nvmls_table_replaces_the_documented_one() -> None:
    nvml = StandInNvml(H100_NVML, "NVIDIA H100 80GB HBM3")
    model = profiles_from_nvml(nvml, "handle-0")
    assert model is not None
    assert 0x7 not in nvml.asked
    # nvidia-smi prints GiB to two decimals (19.62 of NVML's 20096 MiB = 19.625 GiB).
    assert [
        (p.name, p.sms, p.compute_slices, p.memory_slices, p.instances) for p in model.profiles
    ] == [
        (p.name, p.sms, p.compute_slices, p.memory_slices, p.instances)
        for p in H100_SXM5_80GB.profiles
    ]
    assert [p.memory_gib for p in model.profiles] == pytest.approx(
        [p.memory_gib for p in H100_SXM5_80GB.profiles], abs=0.01
    )
    assert (model.key, model.sms, model.memory_gib) == ("NVIDIA H100 80GB HBM3", 132, 79.25)
    assert model.measured
    assert "NVML" in model.source
    advice = recommend(usage(), model)
    assert advice.label == "2g.20gb"


def test_no_table_from_nvml_without_mig_profiles() -> None:
    assert profiles_from_nvml(StandInNvml({}, "NVIDIA A10G"), "handle-0") is None


# -- output -------------------------------------------------------------------------------------


def advices() -> list[Any]:
    return [
        recommend(usage(), H100_SXM5_80GB),
        recommend(usage(workload="notebook", active_fraction=0.05), H100_SXM5_80GB),
        recommend(usage(workload="new", history_seconds=3600), H100_SXM5_80GB),
    ]


def test_table_and_csv_rows() -> None:
    rows = table_rows(advices())
    assert [len(row) for row in rows] == [len(COLUMNS)] * 3
    assert rows[0][:9] == (
        "ml",
        "server",
        "NVIDIA H100 80GB HBM3",
        "MIG",
        "2g.20gb",
        "10.4",
        "26.4",
        "5%",
        "2g.20gb",
    )
    assert rows[1][3:5] == ("time-slicing candidate", "time-slicing")
    assert rows[2][3:9] == ("not enough history", "-", "-", "-", "-", "-")
    parsed = list(csv.reader(io.StringIO(csv_text(advices()))))
    assert parsed[0][:2] == ["namespace", "workload"]
    assert parsed[0][5] == "memory_gib"
    assert [tuple(row) for row in parsed[1:]] == rows


def test_json_records() -> None:
    record = json.loads(json.dumps([advice_record(a) for a in advices()]))[0]
    assert record["verdict"] == "MIG"
    assert record["recommends"] == "2g.20gb"
    assert record["needs"]["memory_gib"] == pytest.approx(10.35)
    assert record["needs"]["sms"] == pytest.approx(26.4)
    assert record["history_hours"] == 48.0
    assert record["table_source"].startswith("nvidia-smi mig -lgip")


def test_metric_samples_name_the_recommended_profile() -> None:
    assert RIGHTSIZE_METRIC == "gpu_profiler_rightsize_recommendation"
    assert RIGHTSIZE_LABELS == ("namespace", "workload", "profile")
    assert metric_samples(advices()) == [
        ({"namespace": "ml", "workload": "server", "profile": "2g.20gb"}, 1.0),
        ({"namespace": "ml", "workload": "notebook", "profile": "time-slicing"}, 1.0),
    ]


@pytest.mark.parametrize("model", [A100_40GB, H100_PCIE_80GB])
def test_every_table_can_be_read_back_from_nvml(model: GpuModel) -> None:
    """A table and NVML's answer for the same GPU give the same profiles (memory slices from
    MiB, as NVML gives no slice count for memory)."""
    # NVML_GPU_INSTANCE_PROFILE_* by (compute slices, memory slices).
    ids = {(1, 1): 0x0, (1, 2): 0x9, (2, 2): 0x1, (3, 4): 0x2, (4, 4): 0x3, (7, 8): 0x4}
    nvml_profiles = {
        ids[(p.compute_slices, p.memory_slices)]: ProfileInfo(
            p.compute_slices,
            p.instances,
            p.sms,
            round(p.memory_gib * 1024),
            f"MIG {p.name}".encode(),
        )
        for p in model.profiles
    }
    read = profiles_from_nvml(StandInNvml(nvml_profiles, model.products[0]), "handle-0")
    assert read is not None
    assert [(p.name, p.sms, p.memory_slices, p.instances) for p in read.profiles] == [
        (p.name, p.sms, p.memory_slices, p.instances) for p in model.profiles
    ]


def test_an_activity_near_zero_caps_the_mps_clients_without_overflow() -> None:
    """A p95 SM activity of a subnormal float once made 1 / p95 infinite (found by Hypothesis)."""
    near_zero = usage(sm_active_p95=2e-323, sm_active_p50=2e-323)
    needs = Needs(memory_gib=1.0, sms=1.0, memory_fraction=0.0)
    assert mps_clients(near_zero, needs, 80.0) == MAX_MPS_CLIENTS
