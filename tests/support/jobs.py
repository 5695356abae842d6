"""Labelled multi-GPU jobs with power: the shapes real traces show that single-signal
generators (``signals``) do not.

Learned from real traces of GPU clusters (evaluation data, never copied into the repository):

- synchronous data-parallel ranks with sub-second steps read a flat 85-100 % at 1 s sampling;
  the only visible loop is the checkpoint cadence, often on rank 0 alone;
- while rank 0 writes a checkpoint, the other ranks wait in an NCCL collective: utilisation reads
  100 % while power falls to near idle (an H100 at about 150 W of 700 W);
- a rank can wait for the whole window (a straggler, a hung peer);
- production serving is mostly zero with bursts at a 1-minute step;
- the ranks of one job stall and resume together (rank 0 near zero, the others pinned at 100 %),
  also when the stalls are irregular (a long pause, slow batches) and show no loop at all.

Every job is one pod: its rows share a group; ``bare_metal_jobs`` are GPUs of one node with no
pod label (``LabelledJob.bare``): only coupled stalls can tell which of them run one job. Power
is in watts within a model's range (``FLOOR``..``LIMIT``, an H100's), and each case says which
prior (owner kind) the job carries.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from profiler_app.analysis import Classification, Context
from profiler_app.core.model import Prior
from tests.support import signals

FLOOR, LIMIT = 70.0, 700.0  # an H100 SXM: idle draw and power limit (W)
COMPUTE_SHARE = 0.75  # of the range above the floor, drawn by a compute-bound training step
WAIT_SHARE = 0.12  # drawn by a rank spinning in a collective


def power_draw(
    util: signals.Signal,
    rng: np.random.Generator,
    *,
    share_at_full: float = COMPUTE_SHARE,
    noise: float = 8.0,
) -> signals.Signal:
    """Board power of a GPU doing work at ``util`` percent: the idle floor plus a share of the
    range proportional to the work (``share_at_full`` of it at 100 %)."""
    clean = FLOOR + (LIMIT - FLOOR) * share_at_full * np.nan_to_num(util) / 100.0
    return np.clip(clean + rng.normal(0.0, noise, util.size), 0.9 * FLOOR, LIMIT)


def _level(n: int, value: float, rng: np.random.Generator, noise: float) -> signals.Signal:
    return np.clip(value + rng.normal(0.0, noise, n), 0.0, 100.0)


def _waiting_power(n: int, rng: np.random.Generator) -> signals.Signal:
    return FLOOR + (LIMIT - FLOOR) * WAIT_SHARE + rng.normal(0.0, 4.0, n)


def _phases(n: int, period: float, pause: float, rng: np.random.Generator) -> np.ndarray:
    """True during the checkpoint pause of each iteration (``pause`` samples of ``period``),
    starting at a random phase."""
    return ((np.arange(n) + rng.uniform(0, period)) % period) < pause


@dataclass(frozen=True)
class LabelledJob:
    """One pod's GPUs: utilisation (and power) rows and the expected verdict of each row."""

    name: str
    step_seconds: float
    util: np.ndarray  # rows x samples, percent
    power: np.ndarray | None  # watts, or None when the exporter does not send power
    job_type: list[str]
    period_seconds: list[float | None]
    prior: str | None = None  # "training" / "serving" from the owner kind, or None
    owner: str = ""
    floor: float = FLOOR
    limit: float = LIMIT
    labels: dict[str, str] = field(default_factory=dict)
    bare: bool = False  # no pod label: one node, no known job

    @property
    def rows(self) -> int:
        return int(self.util.shape[0])

    def context(self, *, with_prior: bool = True) -> Context:
        """What the classifier would know: power against the model's range, one group (one
        node and no group for a bare-metal job), and the owner's prior (left out with
        ``with_prior=False``)."""
        has_power = self.power is not None
        return Context(
            power=self.power,
            power_floor=np.full(self.rows, self.floor) if has_power else None,
            power_limit=np.full(self.rows, self.limit) if has_power else None,
            groups=None if self.bare else np.zeros(self.rows, dtype=np.intp),
            nodes=np.zeros(self.rows, dtype=np.intp),
            priors=[Prior(self.prior) if self.prior and with_prior else None] * self.rows,
            prior_reasons=[self.owner if with_prior else ""] * self.rows,
            names=[f"gpu {row}" for row in range(self.rows)],
        )

    def rights(self, results: list[Classification]) -> list[bool]:
        """Per GPU: job type right and, for a visible loop, period within 10 %."""
        found = []
        for result, job_type, period in zip(
            results, self.job_type, self.period_seconds, strict=True
        ):
            right = result.job_type == job_type
            if right and period is not None:
                right = result.period_seconds is not None and (
                    abs(result.period_seconds - period) <= 0.1 * period
                )
            found.append(right)
        return found


def checkpointing_ranks(
    n: int,
    ranks: int,
    period: float,
    rng: np.random.Generator,
    *,
    pause_share: float = 0.2,
    busy: tuple[float, float] = (86.0, 93.0),
    first_rank: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel ranks computing at a flat level drawn from ``busy`` (sub-second steps
    averaged over each sample), pausing every ``period`` samples while rank 0 writes a
    checkpoint: rank 0 drops to a few percent, the others spin in NCCL at 100 % and near-idle
    power. A pod on another node than rank 0 starts at ``first_rank`` > 0."""
    pause = _phases(n, period, max(2.0, pause_share * period), rng)
    util, power = [], []
    for rank in range(first_rank, first_rank + ranks):
        level = rng.uniform(*busy)
        computing = _level(n, level, rng, min(2.5, (100 - level) / 2))
        if rank == 0:
            row = np.where(pause, _level(n, 2.0, rng, 1.5), computing)
            watts = power_draw(row, rng)
        else:
            row = np.where(pause, 100.0, computing)
            spin = FLOOR + (LIMIT - FLOOR) * WAIT_SHARE + rng.normal(0.0, 4.0, n)
            watts = np.where(pause, spin, power_draw(computing, rng))
        util.append(row)
        power.append(watts)
    return np.stack(util), np.stack(power)


def stalling_ranks(
    n: int, ranks: int, rng: np.random.Generator, *, stalls: int = 8, noise: float = 1.5
) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel ranks that stall together at irregular moments for 5-60 s (slow batches,
    a checkpoint, one long pause): no loop anywhere, rank 0 near zero while the others spin in
    NCCL at 100 % and near-idle power. ``noise`` is the wobble of steady compute (real H100
    ranks: about 1.5 points)."""
    stalled = np.zeros(n, dtype=bool)
    for start in rng.integers(0, n - 60, stalls).tolist():
        stalled[start : start + int(rng.integers(5, 61))] = True
    util, power = [], []
    for rank in range(ranks):
        computing = _level(n, rng.uniform(86, 93), rng, noise)
        if rank == 0:
            row = np.where(stalled, _level(n, 3.0, rng, 2.0), computing)
            watts = power_draw(row, rng)
        else:
            row = np.where(stalled, 100.0, computing)
            watts = np.where(stalled, _waiting_power(n, rng), power_draw(computing, rng))
        util.append(row)
        power.append(watts)
    return np.stack(util), np.stack(power)


def flat_ranks(n: int, ranks: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Ranks computing flat out with no pause in the window: nothing but context tells them
    from a saturated server."""
    util = np.stack([_level(n, rng.uniform(86, 96), rng, 3.0) for _ in range(ranks)])
    return util, np.stack([power_draw(row, rng) for row in util])


def serving_bursts(
    n: int, rng: np.random.Generator, *, rate: float = 0.4, busy_share: float = 0.45
) -> signals.Signal:
    """Production serving at a coarse step: mostly zero, a request burst (10-40 %) in a share
    of the samples that drifts with the day's traffic."""
    drift = np.clip(busy_share + 0.3 * np.sin(np.linspace(0, math.pi, n) + rng.uniform(0, 3)), 0, 1)
    busy = rng.uniform(0, 1, n) < drift * rate * 2
    return np.where(busy, rng.uniform(10, 40, n), 0.0)


def shared_requests(
    n: int, gpus: int, rng: np.random.Generator, *, shared: float = 0.25, solo: float = 0.05
) -> np.ndarray:
    """GPUs of one serving pod, mostly zero: a share of the samples carries a request on every
    GPU at once, and ``solo`` of them one on GPU 0 alone, lasting two samples."""
    together = rng.uniform(0, 1, n) < shared
    alone = rng.uniform(0, 1, n) < solo
    alone[1:] |= alone[:-1]
    rows = [
        np.where(together | (alone if gpu == 0 else False), rng.uniform(96, 100, n), 0.0)
        for gpu in range(gpus)
    ]
    return np.stack(rows)


TRAINS = signals.TRAINING
PYTORCHJOB = {"prior": "training", "owner": "owner PyTorchJob"}
DEPLOYMENT = {"prior": "serving", "owner": "owner Deployment"}


def _job(
    name: str,
    util: np.ndarray,
    power: np.ndarray | None,
    expected: tuple[str, float | None],
    *,
    step: float = 1.0,
    context: dict[str, str] | None = None,
) -> LabelledJob:
    """A job whose every GPU should get ``expected`` = (job type, period in seconds)."""
    rows = util.shape[0]
    verdict, period = expected
    return LabelledJob(
        name, step, util, power, [verdict] * rows, [period] * rows, **(context or {})
    )


DEFAULT_SEED = 20261123


def labelled_jobs(seed: int = DEFAULT_SEED) -> Iterator[LabelledJob]:
    """Every shape above in windows of 10 and 30 minutes at 1 s (6 hours at 1 minute for
    serving), labelled with the verdict each GPU should get."""
    rng = np.random.default_rng(seed)
    for n in (600, 1800):
        window = f"{n // 60}m@1s"
        for period in (60.0, 80.0, 150.0) if n == 600 else (80.0, 300.0, 540.0):
            name = f"{window}-p{period:g}"
            util, power = checkpointing_ranks(n, 8, period, rng)
            yield _job(f"dp-checkpoint-power-{name}", util, power, (TRAINS, period))
            # No power exported: the flat ranks show only the small 90 -> 100 % step, or nothing.
            util[1:] = np.stack([_level(n, rng.uniform(86, 96), rng, 3.0) for _ in range(7)])
            yield _job(f"dp-checkpoint-rank0-only-{name}", util, None, (TRAINS, period))
            # Ranks on another node than rank 0, computing at 100 % (a kernel always resident):
            # waiting at 100 % leaves no mark in utilisation; the loop is in power alone.
            util, power = checkpointing_ranks(n, 4, period, rng, busy=(100, 100), first_rank=4)
            yield _job(f"dp-checkpoint-flat-util-{name}", util, power, (TRAINS, period))
        # One rank waits for the whole window while its peers compute; then a pod whose ranks
        # wait in irregular stretches (stragglers), no loop anywhere.
        util, power = flat_ranks(n, 4, rng)
        util[3], power[3] = 100.0, _waiting_power(n, rng)
        yield _job(f"nccl-wait-whole-window-{window}", util, power, (TRAINS, None))
        util, power = flat_ranks(n, 4, rng)
        for rank in range(4):
            for start in rng.integers(0, n - 60, 3).tolist():
                stop = start + int(rng.integers(8, 40))
                util[rank, start:stop] = 100.0
                power[rank, start:stop] = _waiting_power(stop - start, rng)
        yield _job(f"nccl-wait-stragglers-{window}", util, power, (TRAINS, None))
        # Flat ranks, no pause: only the owner (a PyTorchJob) tells.
        util, power = flat_ranks(n, 8, rng)
        yield _job(f"dp-flat-{window}", util, power, (TRAINS, None), context=PYTORCHJOB)
        # A saturated 8-GPU server (a Deployment), and a memory-bound one: 100 % utilisation at
        # 30-40 % of the power range is work, not waiting.
        util = np.stack([signals.steady_serving(n, rng, level=88, drift=6) for _ in range(8)])
        power = np.stack([power_draw(row, rng) for row in util])
        expected = (signals.INFERENCE, None)
        yield _job(f"serving-saturated-8gpu-{window}", util, power, expected, context=DEPLOYMENT)
        util = np.stack([_level(n, 98, rng, 1.5) for _ in range(2)])
        power = np.stack([power_draw(row, rng, share_at_full=0.38) for row in util])
        yield _job(f"serving-memory-bound-{window}", util, power, expected)
        # Bursty serving whose power is read a sample late: the sample after a burst reads high
        # utilisation at idle power once, which must not look like waiting.
        util = signals.sporadic_bursts(n, rng, bursts=30, shortest=2, longest=6, level=98)
        late = np.roll(power_draw(util, rng), 1)
        yield _job(
            f"serving-bursts-power-late-{window}", util[None], late[None], (signals.BURSTY, None)
        )
    # Production serving at a 1-minute step, 6 hours: mostly zero, with and without power.
    for rate in (0.15, 0.4):
        util = serving_bursts(360, rng, rate=rate)
        expected = (signals.BURSTY, None)
        yield _job(f"serving-1min-rate{rate:g}", util[None], None, expected, step=60)
        power = power_draw(util, rng)[None]
        name = f"serving-1min-rate{rate:g}-power"
        yield _job(name, util[None], power, expected, step=60, context=DEPLOYMENT)
    # A 2-GPU serving pod at a 1-minute step whose GPUs mostly take the same requests: coupled,
    # and one of them sometimes busy for minutes while the other is idle. Not a rank waiting.
    util = shared_requests(360, 2, rng)
    yield _job("serving-1min-shared-requests-2gpu", util, None, (signals.BURSTY, None), step=60)


def _bare(
    name: str, util: np.ndarray, power: np.ndarray | None, verdicts: list[str]
) -> LabelledJob:
    """GPUs of one node with no pod label, each with its own expected job type."""
    periods: list[float | None] = [None] * len(verdicts)
    return LabelledJob(name, 1.0, util, power, verdicts, periods, bare=True)


def bare_metal_jobs(seed: int = DEFAULT_SEED) -> Iterator[LabelledJob]:
    """One node's GPUs without pod labels, in windows of 10 and 30 minutes at 1 s: ranks of one
    job that stall together (with and without power), and the look-alikes that must not be
    taken for one: independent serving GPUs beside a job, tensor-parallel serving whose GPUs
    are busy and idle together, steady servers."""
    rng = np.random.default_rng(seed)
    for n in (600, 1800):
        window = f"{n // 60}m@1s"
        util, power = stalling_ranks(n, 8, rng)
        yield _bare(f"bare-dp-stalls-power-{window}", util, power, [TRAINS] * 8)
        yield _bare(f"bare-dp-stalls-util-only-{window}", util, None, [TRAINS] * 8)
        util, power = checkpointing_ranks(n, 4, 90.0, rng, busy=(88.0, 92.0))
        util[1:] = np.minimum(util[1:], 100.0)
        name = f"bare-dp-checkpoint-util-only-{window}"
        yield LabelledJob(name, 1.0, util, None, [TRAINS] * 4, [90.0] * 4, bare=True)
        # A job's four ranks beside four serving GPUs that burst on their own: two jobs.
        ranks, ranks_power = stalling_ranks(n, 4, rng)
        served = np.stack(
            [signals.sporadic_bursts(n, rng, bursts=12, longest=40) for _ in range(4)]
        )
        util = np.vstack([ranks, served])
        power = np.vstack([ranks_power, np.stack([power_draw(row, rng) for row in served])])
        verdicts = [TRAINS] * 4 + [signals.BURSTY] * 4
        yield _bare(f"bare-job-beside-serving-power-{window}", util, power, verdicts)
        yield _bare(f"bare-job-beside-serving-util-only-{window}", util, None, verdicts)
        # Tensor-parallel serving: four GPUs busy and idle together, one request at a time.
        requests = signals.sporadic_bursts(n, rng, bursts=25, longest=30, noise=0.0) > 50
        util = np.stack([np.where(requests, _level(n, 97.0, rng, 1.5), 0.0) for _ in range(4)])
        power = np.stack([power_draw(row, rng) for row in util])
        yield _bare(f"bare-tensor-parallel-serving-{window}", util, power, [signals.BURSTY] * 4)
        yield _bare(f"bare-tensor-parallel-util-only-{window}", util, None, [signals.BURSTY] * 4)
        util = np.stack([signals.steady_serving(n, rng, level=80) for _ in range(4)])
        verdicts = [signals.INFERENCE] * 4
        yield _bare(f"bare-steady-servers-{window}", util, None, verdicts)


# -- Offline inference that loops: the shapes of real traces' ei-* windows -----------------


def generate_calls(
    n: int,
    rng: np.random.Generator,
    *,
    lengths: tuple[float, float] = (76.0, 76.0),
    low: float = 62.0,
    high: float = 97.0,
    jitter: float = 1.0,
) -> tuple[signals.Signal, signals.Signal]:
    """``generate()`` called over and over without a KV cache, and its power: every token
    recomputes the whole sequence, so utilisation climbs through each call from ``low`` towards
    ``high`` (a sawtooth), and drops when the next call starts from the prompt alone. Calls
    take ``lengths[0]`` seconds in the first half of the window and ``lengths[1]`` in the second
    (the run moves on to longer outputs: the period drifts), with ``jitter`` seconds of noise.
    Power sits at the board's cap and dips for a second between calls. The GPU never rests."""
    util = np.empty(n)
    power = np.empty(n)
    position = 0
    while position < n:
        later = position >= n // 2  # the run moves on to longer outputs half way
        length = max(4, round(lengths[int(later)] + rng.normal(0, jitter)))
        time = np.arange(length)
        climb = high - (high - low) * np.exp(-time / (length / 5))
        stop = min(n, position + length)
        util[position:stop] = climb[: stop - position]
        power[position:stop] = 250.0
        power[position] = 185.0
        position = stop
    return (
        np.clip(util + rng.normal(0, 0.8, n), 0, 100),
        power + rng.normal(0, 1.5, n),
    )


def request_cadence(
    n: int, rng: np.random.Generator, *, period: float = 4.0
) -> tuple[signals.Signal, signals.Signal]:
    """Short ``generate()`` calls back to back every ``period`` seconds: utilisation 88-100 %
    with a shallow dip as each call ends, power swinging with it; no pause anywhere."""
    phase = (np.arange(n) + rng.uniform(0, period)) % period
    util = np.where(phase < 1, 86.0, 97.0) + rng.normal(0, 2.0, n)
    power = FLOOR + (LIMIT - FLOOR) * np.where(phase < 1, 0.2, 0.3) + rng.normal(0, 6.0, n)
    return np.clip(util, 0, 100), power


def layer_split_inference(
    n: int, gpus: int, rng: np.random.Generator, *, calls: tuple[float, float] = (11.0, 17.0)
) -> tuple[np.ndarray, np.ndarray]:
    """A model split layer by layer over ``gpus`` GPUs, ``generate()`` called over and over:
    one GPU works at a time, so each reads about 1/``gpus`` of the time busy (20-30 % for four),
    and all of them stall together for a second or two between calls (each run's fixed prompts
    take 11-17 s). Their stalls coincide like synchronous ranks, at a steady rhythm; their level
    and power say they take turns."""
    stalled = np.zeros(n, dtype=bool)
    length = rng.uniform(*calls)  # the prompts are fixed: every call takes about as long
    position = float(rng.integers(0, 5))
    while position < n:
        position += length + rng.normal(0, 0.3)
        start = round(position)
        stalled[start : start + int(rng.integers(2, 4))] = True
        position += 2.5
    share = 100.0 / gpus
    util = np.stack(
        [
            np.where(stalled, rng.uniform(1, 6, n), rng.uniform(0.8, 1.2, n) * share)
            for _ in range(gpus)
        ]
    )
    power = FLOOR + (LIMIT - FLOOR) * 0.45 * util / 100.0 + rng.normal(0, 5.0, util.shape)
    return np.clip(util, 0, 100), power


def offline_inference_jobs(seed: int = DEFAULT_SEED) -> Iterator[LabelledJob]:
    """Offline inference that loops, in windows of 15 and 30 minutes at 1 s, with no workload
    context (a bare-metal exporter, a bare pod) and as a Deployment: every GPU is inference."""
    rng = np.random.default_rng(seed)
    inference = signals.INFERENCE
    for n in (900, 1800):
        window = f"{n // 60}m@1s"
        for name, lengths in (("steady", (76.0, 76.0)), ("drifting", (24.0, 40.0))):
            util, power = generate_calls(n, rng, lengths=lengths)
            for context in ({}, DEPLOYMENT):
                suffix = "-deployment" if context else ""
                yield _job(
                    f"generate-sawtooth-{name}-{window}{suffix}",
                    util[None],
                    power[None],
                    (inference, None),
                    context=context,
                )
        util, power = request_cadence(n, rng)
        yield _job(f"generate-4s-cadence-{window}", util[None], power[None], (inference, None))
        util, power = layer_split_inference(n, 4, rng)
        yield _job(f"layer-split-4gpu-pod-{window}", util, power, (inference, None))
        yield _bare(f"layer-split-4gpu-bare-{window}", util, power, [inference] * 4)
        yield _bare(f"layer-split-4gpu-bare-no-power-{window}", util, None, [inference] * 4)
