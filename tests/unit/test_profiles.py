"""build_profiles: classification of the primary field, joins of the others, order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from profiler_app.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, SeriesMatrix
from profiler_app.profiles import build_profiles
from tests.support import signals

STEP = 10.0
N = 180  # 30 minutes


def labels(host: str, gpu: str, pod: str | None = None, **extra: str) -> dict[str, str]:
    result = {"Hostname": host, "gpu": gpu, "UUID": f"GPU-{host}-{gpu}", **extra}
    if pod:
        result |= {"namespace": "ml", "pod": pod}
    return result


def matrix(field: str, rows: list[tuple[dict[str, str], np.ndarray]]) -> SeriesMatrix:
    timestamps = STEP * np.arange(N, dtype=np.float64)
    values = np.vstack([row for _, row in rows]) if rows else np.empty((0, N))
    return SeriesMatrix(field, [dict(lab) for lab, _ in rows], timestamps, values, STEP)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_each_primary_series_is_classified_and_joined_with_other_fields(
    rng: np.random.Generator,
) -> None:
    training = signals.square(N, 12, rng, duty=0.6)
    serving = signals.steady_serving(N, rng)
    idle = signals.near_zero_noise(N, rng)
    util = matrix(
        GPU_UTIL,
        [
            (labels("n1", "10", "serve"), serving),
            (labels("n1", "2"), idle),
            (labels("n1", "0", "train"), training),
        ],
    )
    # Other fields come in another order; GPU 0's carries an extra label (another scrape job).
    fb = matrix(
        FB_USED,
        [
            (labels("n1", "2"), np.zeros(N)),
            (labels("n1", "0", "train", job="other"), np.full(N, 61_000.0)),
            (labels("n1", "10", "serve"), np.full(N, 20_000.0)),
        ],
    )
    copy = matrix(MEM_COPY_UTIL, [(labels("n1", "0", "train"), training / 2)])
    profiles = build_profiles([fb, util, copy])

    assert [p.gpu for p in profiles] == ["0", "2", "10"]  # numeric order, not text order
    train, quiet, serve = profiles
    assert (train.job_type, quiet.job_type, serve.job_type) == ("training", "idle", "inference")
    assert train.period_seconds is not None
    assert math.isclose(train.period_seconds, 120, rel_tol=0.1)
    assert quiet.period_seconds is None
    assert train.stats[FB_USED].max == 61_000
    assert serve.stats[FB_USED].max == 20_000
    assert quiet.stats[FB_USED].max == 0
    assert math.isclose(train.stats[MEM_COPY_UTIL].max, training.max() / 2)
    assert MEM_COPY_UTIL not in serve.stats  # no such series for GPU 10
    assert math.isclose(train.stats[GPU_UTIL].max, training.max())
    assert (train.namespace, train.pod, train.uuid, train.hostname) == (
        "ml",
        "train",
        "GPU-n1-0",
        "n1",
    )
    assert (quiet.namespace, quiet.pod) == (None, None)
    assert train.labels == labels("n1", "0", "train")


def test_a_gpu_handed_between_pods_gives_one_profile_per_pod(rng: np.random.Generator) -> None:
    first = np.where(np.arange(N) < 90, 80.0, np.nan)
    second = np.where(np.arange(N) >= 90, 40.0, np.nan)
    util = matrix(GPU_UTIL, [(labels("n1", "0", "b"), second), (labels("n1", "0", "a"), first)])
    fb = matrix(
        FB_USED,
        [(labels("n1", "0", "a"), np.full(N, 100.0)), (labels("n1", "0", "b"), np.full(N, 200.0))],
    )
    a, b = build_profiles([util, fb])
    assert (a.pod, b.pod) == ("a", "b")
    assert (a.stats[GPU_UTIL].max, b.stats[GPU_UTIL].max) == (80, 40)
    assert (a.stats[FB_USED].max, b.stats[FB_USED].max) == (100, 200)


def test_duplicate_series_of_another_field_merge_with_their_maximum() -> None:
    util = matrix(GPU_UTIL, [(labels("n1", "0"), np.full(N, 50.0))])
    early = np.where(np.arange(N) < 100, 10.0, np.nan)
    late = np.where(np.arange(N) >= 100, 30.0, np.nan)
    fb = matrix(
        FB_USED,
        [(labels("n1", "0", instance="a"), early), (labels("n1", "0", instance="b"), late)],
    )
    (profile,) = build_profiles([util, fb])
    assert profile.stats[FB_USED].max == 30
    assert math.isclose(profile.stats[FB_USED].mean, (100 * 10 + 80 * 30) / N)


def test_ambiguous_gpu_only_matches_are_not_joined() -> None:
    util = matrix(GPU_UTIL, [(labels("n1", "0"), np.full(N, 50.0))])
    fb = matrix(
        FB_USED,
        [(labels("n1", "0", "a"), np.full(N, 1.0)), (labels("n1", "0", "b"), np.full(N, 2.0))],
    )
    (profile,) = build_profiles([util, fb])
    assert FB_USED not in profile.stats


def test_hosts_sort_first_and_a_custom_node_label_is_used() -> None:
    rows = [
        ({"instance": "b", "gpu": "1", "UUID": "u1"}, np.zeros(N)),
        ({"instance": "a", "gpu": "1", "UUID": "u2"}, np.zeros(N)),
        ({"instance": "a", "gpu": "0", "UUID": "u3"}, np.zeros(N)),
    ]
    profiles = build_profiles([matrix(GPU_UTIL, rows)], node_label="instance")
    assert [(p.hostname, p.gpu) for p in profiles] == [("a", "0"), ("a", "1"), ("b", "1")]


def test_another_primary_field_and_empty_input() -> None:
    fb = matrix(FB_USED, [(labels("n1", "0"), np.zeros(N))])
    (profile,) = build_profiles([fb], primary_field=FB_USED)
    assert profile.job_type == "idle"
    assert build_profiles([matrix(GPU_UTIL, [])]) == []
    with pytest.raises(ValueError, match="no DCGM_FI_DEV_GPU_UTIL matrix"):
        build_profiles([fb])
