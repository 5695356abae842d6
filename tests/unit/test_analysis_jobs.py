"""The analysis on multi-GPU jobs with power: flat data-parallel ranks, NCCL waiting,
checkpoint-only loops, serving at a 1-minute step (tests/support/jobs.py), and the rules that
combine the evidence: power against the GPU's range, siblings, owner priors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from profiler_app.analysis import Basis, Context, JobType, classify_matrix
from profiler_app.analysis.coupling import Coupling, coupled_pairs, join
from profiler_app.analysis.evidence import sustained
from profiler_app.core.model import Prior
from tests.support import jobs, signals

JOBS = list(jobs.labelled_jobs())
BARE = list(jobs.bare_metal_jobs())
OFFLINE = list(jobs.offline_inference_jobs())


@pytest.mark.parametrize("job", JOBS, ids=[job.name for job in JOBS])
def test_every_gpu_of_a_labelled_job_gets_its_verdict(job: jobs.LabelledJob) -> None:
    results = classify_matrix(job.util, job.step_seconds, job.context())

    assert all(job.rights(results)), [(r.job_type, r.period_seconds, r.reasons) for r in results]
    for result in results:
        assert 0.0 < result.confidence < 1.0
        assert result.reasons


@pytest.mark.parametrize("job", BARE, ids=[job.name for job in BARE])
def test_bare_metal_gpus_are_one_job_only_when_their_stalls_coincide(
    job: jobs.LabelledJob,
) -> None:
    results = classify_matrix(job.util, job.step_seconds, job.context())

    assert all(job.rights(results)), [(r.job_type, r.reasons) for r in results]


@pytest.mark.parametrize("job", OFFLINE, ids=[job.name for job in OFFLINE])
def test_offline_inference_that_loops_is_not_training(job: jobs.LabelledJob) -> None:
    """generate() sawtooths (steady and drifting), a 4 s request cadence, a model split layer by
    layer over four GPUs (coupled stalls at 25 %): each loops, none is training, and each says
    why."""
    results = classify_matrix(job.util, job.step_seconds, job.context())

    assert all(job.rights(results)), [(r.job_type, r.reasons) for r in results]
    looped = [r for r in results if r.basis is Basis.CADENCE]
    assert looped, [r.reasons for r in results]
    for result in looped:
        assert result.reasons[0].startswith("period ")
        assert {
            "no pause in the loop",
            "loop in a serving workload",
        } & set(result.reasons) or any(
            reason.startswith(("period drifts", "job peaks at util", "util peaks at"))
            for reason in result.reasons
        )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_offline_inference_drawn_with_other_seeds_stays_inference(seed: int) -> None:
    for job in jobs.offline_inference_jobs(seed):
        results = classify_matrix(job.util, job.step_seconds, job.context())
        assert all(job.rights(results)), (job.name, [r.reasons for r in results])


def test_a_training_owner_keeps_offline_generation_training_without_a_period() -> None:
    """Context decides the ambiguity both ways: the same sawtooth in a Job is training (the
    owner says so), but its loop is still no iteration period."""
    util, power = jobs.generate_calls(1800, np.random.default_rng(8))
    context = Context(power=power[None], priors=[Prior.TRAINING], prior_reasons=["owner Job"])

    [result] = classify_matrix(util[None], 1.0, context)

    assert (result.job_type, result.basis, result.period_seconds) == (
        JobType.TRAINING,
        Basis.PRIOR,
        None,
    )
    assert "no pause in the loop" in result.reasons


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_bare_metal_corpora_drawn_with_other_seeds_stay_right(seed: int) -> None:
    for job in jobs.bare_metal_jobs(seed):
        results = classify_matrix(job.util, job.step_seconds, job.context())
        assert all(job.rights(results)), (job.name, [r.job_type for r in results])


def test_a_stalled_rank_joins_its_peers_by_coupled_stalls_and_they_wait_for_it() -> None:
    """Without pods and without power: rank 0 stalls (idle over 30 % of the window, no loop),
    its peers read 100 % at the same moments. Without the node (no coupling) rank 0 would be
    bursty and the others inference."""
    job = next(job for job in BARE if job.name.startswith("bare-dp-stalls-util-only"))
    alone = Context(names=[f"gpu {row}" for row in range(job.rows)])

    coupled = classify_matrix(job.util, 1.0, job.context())
    uncoupled = classify_matrix(job.util, 1.0, alone)

    assert coupled[0].basis is Basis.SIBLING
    assert {r.basis for r in coupled[1:]} == {Basis.WAITING}
    assert coupled[1].reasons[0] == "util 100% while gpu 0 stalls"
    assert coupled[1].reasons[2] == "stalls with gpu 0"
    assert coupled[0].reasons[0].endswith(" waiting")
    assert coupled[0].reasons[1].startswith("stalls with gpu ")
    assert {r.job_type for r in uncoupled} == {JobType.INFERENCE}


def test_coupling_needs_repeated_joint_stalls_and_enough_samples() -> None:
    rng = np.random.default_rng(8)
    util, _ = jobs.stalling_ranks(600, 2, rng)
    one_stall = 90.0 + rng.normal(0, 1, (2, 100))
    one_stall[:, 40:60] = [[2.0], [100.0]]  # one shared lull is not a job
    node = Context(nodes=np.zeros(2, dtype=np.intp))
    busy = np.ones(2, dtype=bool)

    assert coupled_pairs(util, busy, node).left.tolist() == [0]
    assert coupled_pairs(one_stall, busy, node).left.size == 0
    assert coupled_pairs(util[:, :50], busy, node).left.size == 0  # too few samples
    assert coupled_pairs(util, busy, Context()).left.size == 0  # nothing says they may share


def test_coupled_rows_of_no_known_job_join_while_pods_stay_their_own_job() -> None:
    pairs = Coupling(np.array([0, 1, 3]), np.array([1, 2, 4]), np.ones(3))

    assert join(None, pairs, 5).tolist() == [0, 0, 0, 1, 1]
    assert join(np.array([7, -1, -1, -1, -1]), pairs, 5).tolist() == [7, 8, 8, 9, 9]


def test_independent_busy_gpus_of_one_node_are_rarely_coupled() -> None:
    """Serving GPUs, random walks and bursts drawn independently, eight to a node: how often
    two of them look coupled (each such pair could share a sibling's training evidence)."""
    rng = np.random.default_rng(9)
    makers = (
        lambda: signals.sporadic_bursts(600, rng, bursts=12, longest=40),
        lambda: signals.steady_serving(600, rng),
        lambda: signals.random_walk(600, rng),
        lambda: jobs.serving_bursts(600, rng),
    )
    nodes = 100
    util = np.stack([makers[row % 4]() for row in range(8 * nodes)])
    context = Context(nodes=np.repeat(np.arange(nodes), 8))

    pairs = coupled_pairs(util, np.ones(8 * nodes, dtype=bool), context)

    assert pairs.left.size <= 0.01 * nodes * 28, pairs.left.size


def test_the_job_corpus_spans_the_shapes_of_the_real_traces() -> None:
    names = " ".join(job.name for job in JOBS)
    for shape in (
        "dp-checkpoint-power",
        "dp-checkpoint-rank0-only",
        "dp-checkpoint-flat-util",
        "nccl-wait-whole-window",
        "nccl-wait-stragglers",
        "serving-1min",
        "serving-saturated-8gpu",
        "serving-memory-bound",
    ):
        assert shape in names
    bases = set()
    for job in JOBS:
        bases |= {r.basis for r in classify_matrix(job.util, job.step_seconds, job.context())}
    assert bases >= {
        Basis.UTIL_LOOP,
        Basis.SIGNAL_LOOP,
        Basis.WAITING,
        Basis.SIBLING,
        Basis.PRIOR,
        Basis.BURSTY,
        Basis.STEADY,
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_job_corpora_drawn_with_other_seeds_stay_right(seed: int) -> None:
    found = [
        right
        for job in jobs.labelled_jobs(seed)
        for right in job.rights(classify_matrix(job.util, job.step_seconds, job.context()))
    ]

    assert np.mean(found) >= 0.98


def test_flat_ranks_without_context_read_as_inference() -> None:
    """What the classifier cannot see: ranks of sub-second steps with no pause in the window
    and no owner look exactly like a saturated server."""
    job = next(job for job in JOBS if job.name.startswith("dp-flat-"))

    results = classify_matrix(job.util, 1.0, job.context(with_prior=False))

    assert {r.job_type for r in results} == {JobType.INFERENCE}


def test_a_loop_in_power_counts_only_where_utilisation_is_flat() -> None:
    rng = np.random.default_rng(1)
    util, power = jobs.checkpointing_ranks(900, 1, 90.0, rng, busy=(100, 100), first_rank=1)
    moving = signals.random_walk(900, rng, step=4.0)
    matrix = np.stack([util[0], moving])
    context = Context(power=np.stack([power[0], power[0]]))

    flat_rank, busy_server = classify_matrix(matrix, 1.0, context)

    assert flat_rank.basis is Basis.SIGNAL_LOOP
    assert flat_rank.period_seconds == pytest.approx(90, rel=0.05)
    assert flat_rank.reasons[:2] == ("period 90s in power", "no loop in util")
    assert busy_server.job_type != JobType.TRAINING


def test_memory_copy_is_the_last_resort_for_a_loop_when_utilisation_is_flat() -> None:
    rng = np.random.default_rng(5)
    pause = (np.arange(900) % 90) < 18
    util = np.full((1, 900), 100.0)
    copy = np.where(pause, 1.0, 35.0 + rng.normal(0, 2, 900))[None, :]

    [result] = classify_matrix(util, 1.0, Context(mem_copy=copy))

    assert result.reasons[0] == "period 90s in mem-copy"
    assert result.period_seconds == pytest.approx(90, rel=0.05)


def test_waiting_needs_an_absolute_power_range() -> None:
    """In the window's own range the lowest reading is 0 % by construction: no waiting."""
    rng = np.random.default_rng(2)
    util, power = jobs.flat_ranks(600, 1, rng)
    util[0], power[0] = 100.0, jobs.FLOOR + 63 + rng.normal(0, 1, 600)
    known = Context(power=power, power_floor=np.array([70.0]), power_limit=np.array([700.0]))

    [judged] = classify_matrix(util, 1.0, known)
    [unknown] = classify_matrix(util, 1.0, Context(power=power))

    assert judged.basis is Basis.WAITING
    assert judged.reasons[0] == "util 100% at 10% of power range"
    assert unknown.job_type == JobType.INFERENCE


def test_sm_activity_also_tells_waiting_and_a_serving_owner_outweighs_it() -> None:
    util = np.full((1, 600), 100.0)
    sm_active = np.full((1, 600), 0.12)  # one spinning kernel on a few SMs

    [waits] = classify_matrix(util, 1.0, Context(sm_active=sm_active))
    [serves] = classify_matrix(
        util,
        1.0,
        Context(sm_active=sm_active, priors=[Prior.SERVING], prior_reasons=["owner Deployment"]),
    )

    assert waits.basis is Basis.WAITING
    assert waits.reasons[0] == "util 100% at sm-active 12%"
    assert serves.job_type == JobType.INFERENCE
    assert serves.reasons[-1] == "owner Deployment"


def test_context_decides_a_loop_and_a_flat_gpu_both_ways_but_never_an_idle_one() -> None:
    """A training workload keeps a loop (with more confidence) and a flat GPU training; a serving
    workload makes the same loop a request cadence; an idle GPU stays idle whatever the owner."""
    rng = np.random.default_rng(3)
    idle = np.zeros(600)
    loop = jobs.checkpointing_ranks(600, 1, 60.0, rng)[0][0]
    flat = np.full(600, 95.0)
    context = Context(
        priors=[Prior.TRAINING, Prior.SERVING, Prior.TRAINING, Prior.SERVING, Prior.TRAINING],
        prior_reasons=["owner Job", "owner Deployment", "owner Job", "owner Deployment", ""],
    )

    results = classify_matrix(np.stack([idle, loop, flat, flat, loop]), 1.0, context)

    assert [r.job_type for r in results] == [
        JobType.IDLE,
        JobType.INFERENCE,
        JobType.TRAINING,
        JobType.INFERENCE,
        JobType.TRAINING,
    ]
    served = results[1]
    assert served.basis is Basis.CADENCE
    assert served.period_seconds is None
    assert served.reasons == (
        "period 60s in util",
        "loop in a serving workload",
        "owner Deployment",
    )
    assert results[2].basis is Basis.PRIOR
    assert results[2].period_seconds is None
    trained, alone = results[4], classify_matrix(loop[None], 1.0)[0]
    assert trained.basis is alone.basis is Basis.UTIL_LOOP
    assert alone.reasons == ("period 60s in util", "no workload context")
    assert trained.confidence > alone.confidence


def test_a_loop_with_waiting_ranks_is_training_even_in_a_serving_workload() -> None:
    """The one waveform a serving engine does not make: a checkpoint loop whose ranks spin in a
    collective at near-idle power meanwhile. It outweighs the owner, with a reason saying so."""
    rng = np.random.default_rng(5)
    util, power = jobs.checkpointing_ranks(600, 4, 60.0, rng)
    context = Context(
        power=power,
        power_floor=np.full(4, jobs.FLOOR),
        power_limit=np.full(4, jobs.LIMIT),
        groups=np.zeros(4, dtype=np.intp),
        priors=[Prior.SERVING] * 4,
        prior_reasons=["owner Deployment"] * 4,
    )

    results = classify_matrix(util, 1.0, context)

    assert {r.job_type for r in results} == {JobType.TRAINING}
    assert results[0].basis is Basis.UTIL_LOOP
    assert "loop and waiting ranks: training evidence" in results[0].reasons
    assert (
        results[0].confidence
        < classify_matrix(util, 1.0, replace(context, priors=None, prior_reasons=None))[
            0
        ].confidence
    )


def test_siblings_take_the_period_of_the_strongest_evidence_in_their_group() -> None:
    rng = np.random.default_rng(4)
    util, _ = jobs.checkpointing_ranks(600, 3, 60.0, rng)
    util[1:] = 92.0
    other_job = np.full((2, 600), 92.0)
    matrix = np.vstack([util, other_job])
    groups = np.array([5, 5, 5, 9, -1])

    results = classify_matrix(matrix, 1.0, Context(groups=groups, names=list("abcde")))

    assert [r.basis for r in results] == [
        Basis.UTIL_LOOP,
        Basis.SIBLING,
        Basis.SIBLING,
        Basis.STEADY,
        Basis.STEADY,
    ]
    assert results[2].reasons == ("sibling a periodic", "no workload context")
    assert results[2].period_seconds == results[0].period_seconds
    assert results[2].confidence < results[0].confidence


def test_a_context_that_does_not_fit_the_matrix_is_refused() -> None:
    with pytest.raises(ValueError, match="power has shape"):
        classify_matrix(np.zeros((2, 30)), 1.0, Context(power=np.zeros((2, 29))))
    with pytest.raises(ValueError, match="groups has 1 entries for 2 rows"):
        classify_matrix(np.zeros((2, 30)), 1.0, Context(groups=np.zeros(1, dtype=np.intp)))


def test_sustained_keeps_only_runs_long_enough() -> None:
    flags = np.array([[1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 1]], dtype=bool)

    assert sustained(flags, 3).astype(int).tolist() == [[0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0]]
    assert sustained(flags, 1).tolist() == flags.tolist()
    assert not sustained(flags, 20).any()
