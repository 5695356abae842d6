"""build_profiles: one profile per GPU whatever its labels did, every signal and the job's
other GPUs taken into account, other fields joined, workloads as priors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from profiler_app.core.model import (
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    MEM_COPY_UTIL,
    POWER_MGMT_LIMIT,
    POWER_USAGE,
    PodShare,
    SeriesMatrix,
)
from profiler_app.profiles.build import build_profiles
from profiler_app.profiles.workloads import workload_from_owner
from tests.support import jobs, signals

STEP = 10.0
N = 180  # 30 minutes
H100 = "NVIDIA H100 80GB HBM3"


def labels(host: str, gpu: str, pod: str | None = None, **extra: str) -> dict[str, str]:
    result = {"Hostname": host, "gpu": gpu, "UUID": f"GPU-{host}-{gpu}", **extra}
    if pod:
        result |= {"namespace": "ml", "pod": pod}
    return result


def matrix(
    field: str, rows: list[tuple[dict[str, str], np.ndarray]], step: float = STEP
) -> SeriesMatrix:
    width = rows[0][1].size if rows else N
    timestamps = step * np.arange(width, dtype=np.float64)
    values = np.vstack([row for _, row in rows]) if rows else np.empty((0, width))
    return SeriesMatrix(field, [dict(lab) for lab, _ in rows], timestamps, values, step)


def until(column: int, values: np.ndarray) -> np.ndarray:
    return np.where(np.arange(values.size) < column, values, np.nan)


def since(column: int, values: np.ndarray) -> np.ndarray:
    return np.where(np.arange(values.size) >= column, values, np.nan)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def test_each_gpu_is_classified_and_joined_with_other_fields(rng: np.random.Generator) -> None:
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
    assert train.reasons[0] == "period 120s in util"
    assert train.confidence is not None
    assert 0.5 < train.confidence <= 1.0
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
    assert train.pods == (PodShare("ml", "train", 1.0, 0.0, STEP * (N - 1)),)
    assert (quiet.namespace, quiet.pod, quiet.pods) == (None, None, ())
    assert train.labels == labels("n1", "0", "train")


def test_a_pod_handover_is_one_profile_with_the_current_pod_and_the_shares(
    rng: np.random.Generator,
) -> None:
    loop = signals.square(N, 12, rng, duty=0.6)
    util = matrix(
        GPU_UTIL,
        [(labels("n1", "0", "b"), since(120, loop)), (labels("n1", "0", "a"), until(120, loop))],
    )
    fb = matrix(
        FB_USED,
        [
            (labels("n1", "0", "a"), until(120, np.full(N, 100.0))),
            (labels("n1", "0", "b"), since(120, np.full(N, 200.0))),
        ],
    )

    (profile,) = build_profiles([util, fb])

    assert (profile.namespace, profile.pod) == ("ml", "b")
    assert profile.pods == (
        PodShare("ml", "a", 120 / N, 0.0, STEP * 119),
        PodShare("ml", "b", 60 / N, STEP * 120, STEP * (N - 1)),
    )
    assert profile.job_type == "training"  # the loop runs across the handover: one time line
    assert profile.stats[GPU_UTIL].max == loop.max()
    assert profile.stats[FB_USED].max == 200
    assert profile.labels["pod"] == "b"


def test_an_exporter_restart_changes_labels_not_the_gpu(rng: np.random.Generator) -> None:
    """dcgm-exporter restarted (a new ``instance``) a third into the window, with one sample
    scraped by both: one GPU, one profile, the overlap merged, the latest labels kept."""
    loop = signals.square(N, 12, rng, duty=0.6)
    old = labels("n1", "0", "train", instance="10.0.0.1:9400")
    new = labels("n1", "0", "train", instance="10.0.0.2:9400")
    util = matrix(GPU_UTIL, [(old, until(61, loop)), (new, since(60, loop))])

    (profile,) = build_profiles([util])

    assert profile.job_type == "training"
    assert profile.period_seconds == pytest.approx(120, rel=0.1)
    assert profile.labels["instance"] == "10.0.0.2:9400"
    assert [(p.pod, p.share) for p in profile.pods] == [("train", 1.0)]


def test_a_gpu_that_disappears_and_returns_is_one_profile(rng: np.random.Generator) -> None:
    loop = signals.square(N, 12, rng, duty=0.6)
    gapped = loop.copy()
    gapped[60:90] = np.nan  # the exporter lost the GPU for 5 minutes
    util = matrix(GPU_UTIL, [(labels("n1", "0", "train"), gapped)])

    (profile,) = build_profiles([util])

    assert profile.job_type == "training"
    assert profile.period_seconds == pytest.approx(120, rel=0.1)
    assert [(p.pod, p.share) for p in profile.pods] == [("train", 1.0)]


def test_series_without_a_uuid_join_the_gpu_of_their_index_and_a_new_uuid_is_a_new_gpu() -> None:
    no_uuid = {"Hostname": "n1", "gpu": "0"}
    util = matrix(
        GPU_UTIL,
        [
            (no_uuid, until(60, np.full(N, 50.0))),
            (labels("n1", "0"), since(60, np.full(N, 50.0))),
            ({"Hostname": "n1", "gpu": "1"}, np.zeros(N)),  # no UUID anywhere: by index
            (labels("n2", "0"), np.zeros(N)),  # same index, another node
        ],
    )

    profiles = build_profiles([util])

    assert [(p.hostname, p.gpu, p.uuid) for p in profiles] == [
        ("n1", "0", "GPU-n1-0"),
        ("n1", "1", ""),
        ("n2", "0", "GPU-n2-0"),
    ]
    assert profiles[0].stats[GPU_UTIL].mean == 50.0


def test_a_replaced_gpu_under_the_same_index_is_another_profile_the_current_one_last() -> None:
    util = matrix(
        GPU_UTIL,
        [
            ({**labels("n1", "0"), "UUID": "GPU-new"}, since(60, np.zeros(N))),
            ({**labels("n1", "0"), "UUID": "GPU-old"}, until(60, np.zeros(N))),
        ],
    )

    assert [p.uuid for p in build_profiles([util])] == ["GPU-old", "GPU-new"]


def test_an_idle_gpu_holding_memory_says_so() -> None:
    util = matrix(GPU_UTIL, [(labels("n1", "0", "notebook"), np.zeros(N))])
    fb = matrix(FB_USED, [(labels("n1", "0", "notebook"), np.full(N, 40_960.0))])

    (profile,) = build_profiles([util, fb])

    assert profile.job_type == "idle"
    assert profile.reasons == ("util idle 100% of samples", "memory held 40960 MiB")


def test_a_profiling_ratio_field_is_classified_in_percent_and_summarised_in_its_units(
    rng: np.random.Generator,
) -> None:
    ratio = signals.square(N, 12, rng, duty=0.6) / 100
    engine = matrix(GR_ENGINE_ACTIVE, [(labels("n1", "0"), ratio)])

    (profile,) = build_profiles([engine], primary_field=GR_ENGINE_ACTIVE)

    assert profile.job_type == "training"
    assert profile.stats[GR_ENGINE_ACTIVE].max == pytest.approx(ratio.max())


def _ranks(rng: np.random.Generator, model: str = H100) -> list[SeriesMatrix]:
    """A 4-GPU pod at 1 s: rank 0 checkpoints every 60 s; ranks 1-3 wait in NCCL meanwhile."""
    util, power = jobs.checkpointing_ranks(600, 4, 60.0, rng)
    names = [labels("n1", str(rank), "trainer-0", modelName=model) for rank in range(4)]
    return [
        matrix(GPU_UTIL, list(zip(names, util, strict=True)), step=1.0),
        matrix(POWER_USAGE, list(zip(names, power, strict=True)), step=1.0),
    ]


def test_power_against_the_models_range_shows_ranks_waiting(rng: np.random.Generator) -> None:
    profiles = build_profiles(_ranks(rng))

    assert [p.job_type for p in profiles] == ["training"] * 4
    assert all(p.period_seconds == pytest.approx(60, rel=0.05) for p in profiles)
    waiting = [reason for reason in profiles[1].reasons if reason.startswith("util ")]
    assert waiting == ["util 100% at 12% of power range"]
    assert POWER_USAGE in profiles[1].stats


def test_an_exported_power_limit_wins_over_the_model_table(rng: np.random.Generator) -> None:
    """The same draw judged against a 1,400 W limit is even closer to idle; with an unknown
    model and no limit, power is judged within the window only: no waiting can be told."""
    util, power = _ranks(rng, model="NVIDIA H100 80GB HBM3")
    limit = matrix(
        POWER_MGMT_LIMIT, [(row, np.full(600, 1400.0)) for row in power.labels], step=1.0
    )
    limited = build_profiles([util, power, limit])
    unknown = build_profiles(_ranks(np.random.default_rng(7), model="GPU"))

    assert "util 100% at 6% of power range" in limited[1].reasons
    assert POWER_MGMT_LIMIT not in limited[1].stats  # describes the GPU, not its work
    assert not any(reason.startswith("util 100% at") for reason in unknown[1].reasons)


def test_a_loop_on_one_gpu_is_evidence_for_its_siblings(rng: np.random.Generator) -> None:
    """Rank 0 checkpoints; ranks 1-3 read a flat 90 % and no power is exported."""
    util, _ = jobs.checkpointing_ranks(600, 4, 60.0, rng)
    util[1:] = np.clip(90 + rng.normal(0, 3, (3, 600)), 0, 100)
    rows = [(labels("n1", str(rank), "trainer-0"), util[rank]) for rank in range(4)]
    alone = [(labels("n1", str(rank), f"solo-{rank}"), util[rank]) for rank in range(4)]

    together = build_profiles([matrix(GPU_UTIL, rows, step=1.0)])
    apart = build_profiles([matrix(GPU_UTIL, alone, step=1.0)])

    assert [p.job_type for p in together] == ["training"] * 4
    assert together[2].reasons[0] == "sibling gpu 0 periodic"
    assert together[2].period_seconds == pytest.approx(60, rel=0.05)
    assert together[2].stats[GPU_UTIL].max == util[2].max()  # its own statistics
    assert [p.job_type for p in apart] == ["training", "inference", "inference", "inference"]


def test_pods_of_one_workload_are_one_job(rng: np.random.Generator) -> None:
    """Two worker pods of one PyTorchJob on the node: the loop in one pod decides the other's."""
    util, _ = jobs.checkpointing_ranks(600, 2, 60.0, rng)
    util[1] = np.clip(90 + rng.normal(0, 3, 600), 0, 100)
    rows = [
        (labels("n1", "0", "llama-worker-0"), util[0]),
        (labels("n1", "1", "llama-worker-1"), util[1]),
    ]
    job = workload_from_owner("PyTorchJob", "llama", {})
    known = {("ml", "llama-worker-0"): job, ("ml", "llama-worker-1"): job}

    first, second = build_profiles([matrix(GPU_UTIL, rows, step=1.0)], workloads=known)

    assert (first.job_type, second.job_type) == ("training", "training")
    assert "sibling gpu 0 periodic" in second.reasons
    assert (second.owner_kind, second.owner_name) == ("PyTorchJob", "llama")


def test_the_owner_decides_flat_busy_gpus_and_loops_but_never_idle_ones(
    rng: np.random.Generator,
) -> None:
    flat = np.clip(92 + rng.normal(0, 2, N), 0, 100)
    loop = signals.square(N, 12, rng, duty=0.6)
    idle = np.zeros(N)
    rows = [
        (labels("n1", "0", "trainer"), flat),
        (labels("n1", "1", "trainer-idle"), idle),
        (labels("n1", "2", "server"), loop),
        (labels("n1", "3", "server-flat"), flat),
    ]
    known = {
        ("ml", "trainer"): workload_from_owner("PyTorchJob", "llama", {}),
        ("ml", "trainer-idle"): workload_from_owner("PyTorchJob", "other", {}),
        ("ml", "server"): workload_from_owner("Deployment", "vllm", {}),
        ("ml", "server-flat"): workload_from_owner("Deployment", "tgi", {}),
    }
    trainer, trainer_idle, server, server_flat = build_profiles(
        [matrix(GPU_UTIL, rows)], workloads=known
    )

    assert (trainer.job_type, trainer.reasons[-1]) == ("training", "owner PyTorchJob")
    assert trainer.period_seconds is None
    assert trainer_idle.job_type == "idle"
    # A loop in a serving workload is a request cadence, not training iterations.
    assert (server.job_type, server.basis) == ("inference", "cadence")
    assert server.reasons[-2:] == ("loop in a serving workload", "owner Deployment")
    assert server_flat.job_type == "inference"
    assert server_flat.confidence is not None
    assert trainer.confidence is not None
    assert server_flat.confidence > 0.6  # the owner agrees with the waveform


def test_well_known_pod_labels_on_the_series_give_the_workload() -> None:
    """dcgm-exporter's pod-label enrichment writes Kubernetes labels as Prometheus names."""
    flat = np.full(N, 93.0)
    enriched = labels(
        "n1",
        "0",
        "w-0",
        training_kubeflow_org_job_name="llama",
        training_kubeflow_org_operator_name="pytorchjob-controller",
    )

    (profile,) = build_profiles([matrix(GPU_UTIL, [(enriched, flat)])])

    assert (profile.job_type, profile.owner_kind, profile.owner_name) == (
        "training",
        "PyTorchJob",
        "llama",
    )


def test_another_primary_field_and_empty_input() -> None:
    fb = matrix(FB_USED, [(labels("n1", "0"), np.zeros(N))])
    (profile,) = build_profiles([fb], primary_field=FB_USED)
    assert profile.job_type == "idle"
    assert build_profiles([matrix(GPU_UTIL, [])]) == []
    with pytest.raises(ValueError, match="no DCGM_FI_DEV_GPU_UTIL matrix"):
        build_profiles([fb])


def test_hosts_sort_first_and_a_custom_node_label_is_used() -> None:
    rows = [
        ({"instance": "b", "gpu": "1", "UUID": "u1"}, np.zeros(N)),
        ({"instance": "a", "gpu": "1", "UUID": "u2"}, np.zeros(N)),
        ({"instance": "a", "gpu": "0", "UUID": "u3"}, np.zeros(N)),
    ]
    profiles = build_profiles([matrix(GPU_UTIL, rows)], node_label="instance")
    assert [(p.hostname, p.gpu) for p in profiles] == [("a", "0"), ("a", "1"), ("b", "1")]


def test_fields_on_another_time_grid_are_moved_onto_the_classified_one() -> None:
    util = matrix(GPU_UTIL, [(labels("n1", "0"), np.full(N, 50.0))])
    shifted = SeriesMatrix(
        FB_USED,
        [labels("n1", "0")],
        STEP * np.arange(60, N, dtype=np.float64),
        np.full((1, N - 60), 123.0),
        STEP,
    )

    (profile,) = build_profiles([util, shifted])

    assert profile.stats[FB_USED].max == 123.0
    assert profile.stats[FB_USED].mean == 123.0
