"""Which dcgm-exporter series are a pod's own (profiler_app/profiles/exporter_series.py), sample by
sample, and the node label's two spellings."""

from __future__ import annotations

import numpy as np

from profiler_app.core.model import FB_USED, POWER_USAGE, SeriesMatrix
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.exporter_series import split_field, with_node_label
from profiler_app.profiles.pods import pod_usage
from profiler_app.profiles.timelines import KeyResolver

DEVICE = {"Hostname": "n", "gpu": "0", "UUID": "GPU-0"}
POD = DEVICE | {"namespace": "ml", "pod": "p", "pod_uid": "u-p"}
TIMES = 10.0 * np.arange(60, dtype=np.float64)


def matrix(field: str, rows: list[tuple[dict[str, str], np.ndarray]]) -> SeriesMatrix:
    return SeriesMatrix(
        field, [labels for labels, _ in rows], TIMES, np.vstack([v for _, v in rows]), 10.0
    )


def halves(first: float, second: float) -> np.ndarray:
    return np.concatenate([np.full(30, first), np.full(30, second)])


def test_an_exporter_upgraded_within_the_window_counts_only_the_per_process_half() -> None:
    """Before the upgrade (4.5.2-4.8.1) the pod's series is a copy of the device's, pod_uid and
    all, with no device series beside it; after (4.5.3-4.8.2) the device series returns and the
    pod's series is its own: only that half is the pod's measurement."""
    device = np.concatenate([np.full(30, np.nan), np.full(30, 14_000.0)])
    fb = matrix(FB_USED, [(DEVICE, device), (POD, halves(14_000.0, 4_000.0))])
    split = split_field(fb, KeyResolver(fb.labels, "Hostname"))
    assert split.own is not None
    assert split.presence is not None
    np.testing.assert_array_equal(split.own.values[0, 30:], 4_000.0)
    assert np.isnan(split.own.values[0, :30]).all()
    # The copy's half stays the device's time line.
    merged = np.fmax.reduce(split.device.values, axis=0)
    np.testing.assert_array_equal(merged, 14_000.0)
    power = matrix(POWER_USAGE, [(POD, np.full(60, 300.0))])
    assert split_field(power, KeyResolver(power.labels, "Hostname")).own is None


def test_the_pods_peak_is_its_own_not_the_copy() -> None:
    util = matrix(
        "DCGM_FI_DEV_GPU_UTIL",
        [(DEVICE, np.r_[np.full(30, np.nan), np.full(30, 90.0)]), (POD, halves(90.0, 40.0))],
    )
    (profile,) = build_profiles([util])
    assert profile.pod == "p"
    assert [(own.pod, own.util_max) for own in profile.pod_peaks] == [("p", 40.0)]
    (usage,) = pod_usage([profile], [], {}, "n")
    assert usage.gpu_util_max == 90.0  # a whole GPU: the device's, which are the pod's


def test_either_spelling_of_the_node_label_is_read_as_the_one_asked() -> None:
    lower = {"hostname": "n", "gpu": "0", "UUID": "GPU-0"}
    upper = {"Hostname": "n", "gpu": "1", "UUID": "GPU-1"}
    fields = [matrix(FB_USED, [(lower, np.ones(60)), (upper, np.ones(60))])]
    assert [labels.get("Hostname") for labels in with_node_label(fields, "Hostname")[0].labels] == [
        "n",
        "n",
    ]
    assert [labels.get("hostname") for labels in with_node_label(fields, "hostname")[0].labels] == [
        "n",
        "n",
    ]
    assert with_node_label(fields, "instance")[0].labels == [lower, upper]
