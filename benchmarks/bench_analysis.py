"""Throughput and accuracy of the analysis engine, run by hand: python benchmarks/bench_analysis.py

1. ``classify_matrix`` on 8,000 series x 1,800 samples (a 1,000-node cluster, 8 GPUs each,
   30 minutes at 1 s) on one core: utilisation alone (goal: under 1 s), and utilisation with
   power judged against each GPU's range (goal: under 1.5 s).
2. The per-series, per-lag baseline the Alnair profiler uses (pandas ``Series.autocorr`` for
   every lag up to n/2) on a sample of the same series. Goal: the engine at least 500x faster
   per series.
3. Accuracy of the engine and of the reference rule on the labelled corpus
   (tests/support/signals.py), by job type alone and by job type plus period within 10 %.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

# One core: numpy reads these when it loads its BLAS, so they come before the imports below.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks.alnair_rule import alnair_classify  # noqa: E402
from profiler_app.analysis import Context, classify_matrix  # noqa: E402
from tests.support import jobs, signals  # noqa: E402

GPUS = 8_000
SAMPLES = 1_800
STEP_SECONDS = 1.0


def cluster_matrix(
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, list[tuple[str, float | None]]]:
    """8,000 rows of utilisation and power, labelled (job type, period in samples): training
    loops with periods drawn at random, data-parallel ranks whose checkpoint loop shows only in
    power, serving, random walks, bursts and idle GPUs; every tenth row has gaps."""
    shapes: list[tuple[str, Callable[[float], np.ndarray] | None]] = [
        ("training", lambda period: signals.square(SAMPLES, period, rng)),
        ("training", lambda period: signals.sawtooth(SAMPLES, period, rng)),
        ("training", lambda period: signals.spikes(SAMPLES, period, rng, width=period / 8)),
        ("training", None),  # a flat rank: the loop is in power alone
        ("inference", None),
        ("inference", None),
        ("bursty", None),
        ("idle", None),
    ]
    others = [
        lambda: signals.steady_serving(SAMPLES, rng),
        lambda: signals.random_walk(SAMPLES, rng),
        lambda: signals.sporadic_bursts(SAMPLES, rng, longest=60),
        lambda: signals.near_zero_noise(SAMPLES, rng),
    ]
    labels: list[tuple[str, float | None]] = []
    rows, power_rows = [], []
    for index in range(GPUS):
        label, periodic = shapes[index % len(shapes)]
        power = None
        if periodic is not None:
            period = float(rng.uniform(5, 120))
            values = periodic(period)
            labels.append((label, period))
        elif label == "training":
            period = float(rng.uniform(30, 300))
            util, watts = jobs.checkpointing_ranks(
                SAMPLES, 1, period, rng, busy=(100, 100), first_rank=1
            )
            values, power = util[0], watts[0]
            labels.append((label, period))
        else:
            values = others[index % len(shapes) - 4]()
            labels.append((label, None))
        if power is None:
            power = jobs.power_draw(values, rng)
        if index % 10 == 0:
            values = signals.with_gaps(values, 0.02, rng)
        rows.append(values)
        power_rows.append(power)
    return np.stack(rows), np.stack(power_rows), labels


def node_ids(rows: int) -> np.ndarray:
    """Eight GPUs to a node, as ``build_profiles`` passes them: the busy GPUs of each node are
    compared for coupled stalls (analysis.coupling)."""
    return np.arange(rows, dtype=np.intp) // 8


def power_context(power: np.ndarray) -> Context:
    rows = power.shape[0]
    return Context(
        power=power,
        power_floor=np.full(rows, jobs.FLOOR),
        power_limit=np.full(rows, jobs.LIMIT),
        nodes=node_ids(rows),
    )


def best_of(repeats: int, run: Callable[[], object]) -> tuple[float, float]:
    """Best wall-clock and best CPU seconds of ``repeats`` runs."""
    wall, cpu = [], []
    for _ in range(repeats):
        started_wall, started_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - started_wall)
        cpu.append(time.process_time() - started_cpu)
    return min(wall), min(cpu)


def pandas_per_lag(values: np.ndarray) -> list[float]:
    series = pd.Series(values)
    return [series.autocorr(lag=lag) for lag in range(values.size // 2)]


def accuracy(
    cases: list[signals.LabelledSignal], verdicts: Iterable[tuple[str, float | None]]
) -> tuple[float, float]:
    """(job type right, job type right and period within 10 %) as fractions of the cases."""
    type_right = both_right = 0
    for case, (job_type, period) in zip(cases, verdicts, strict=True):
        if job_type != case.job_type:
            continue
        type_right += 1
        expected = case.period_seconds
        if expected is None:
            both_right += period is None
        else:
            both_right += period is not None and abs(period - expected) <= 0.1 * expected
    return type_right / len(cases), both_right / len(cases)


def engine_verdicts(cases: list[signals.LabelledSignal]) -> list[tuple[str, float | None]]:
    return [
        (str(result.job_type), result.period_seconds)
        for case in cases
        for result in classify_matrix(case.values[None, :], case.step_seconds)
    ]


def false_training_rates(rng: np.random.Generator, count: int) -> list[tuple[str, float]]:
    """How often non-periodic signals come out as training: ``count`` draws of each."""
    stress: list[tuple[str, float, Callable[[], np.ndarray]]] = [
        ("serving, 2 min at 1 s", 1.0, lambda: signals.steady_serving(120, rng)),
        ("serving, 30 min at 1 s", 1.0, lambda: signals.steady_serving(1800, rng)),
        ("random walk, 30 min at 1 s", 1.0, lambda: signals.random_walk(1800, rng)),
        ("random walk, 30 min at 10 s", 10.0, lambda: signals.random_walk(180, rng)),
        (
            "4 bursts of 3-60 samples, 30 min at 1 s",
            1.0,
            lambda: signals.sporadic_bursts(1800, rng, longest=60),
        ),
        (
            "3 bursts of 2-9 samples, 30 min at 10 s",
            10.0,
            lambda: signals.sporadic_bursts(180, rng, bursts=3, shortest=2, longest=9),
        ),
    ]
    rates = []
    for name, step, make in stress:
        results = classify_matrix(np.stack([make() for _ in range(count)]), step)
        rates.append((name, sum(r.job_type == "training" for r in results) / count))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-series", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=10, help="extra corpus draws for accuracy")
    args = parser.parse_args()

    print(f"python {platform.python_version()}, numpy {np.__version__}, pandas {pd.__version__}")
    rng = np.random.default_rng(20261122)
    matrix, power, labels = cluster_matrix(rng)
    context = power_context(power)
    util_context = Context(nodes=node_ids(GPUS))
    classify_matrix(matrix[:100], STEP_SECONDS, power_context(power[:100]))  # warm up

    wall, cpu = best_of(args.repeats, lambda: classify_matrix(matrix, STEP_SECONDS, util_context))
    per_series = cpu / GPUS
    print(
        f"engine, utilisation only: {GPUS} x {SAMPLES} in {wall:.3f} s wall, {cpu:.3f} s CPU "
        f"(best of {args.repeats}), {per_series * 1e6:.1f} us CPU per series"
    )
    both_wall, both_cpu = best_of(
        args.repeats, lambda: classify_matrix(matrix, STEP_SECONDS, context)
    )
    print(
        f"engine, utilisation and power: {GPUS} x {SAMPLES} x 2 in {both_wall:.3f} s wall, "
        f"{both_cpu:.3f} s CPU (best of {args.repeats})"
    )
    node_wall, node_cpu = best_of(
        50, lambda: classify_matrix(matrix[:8], STEP_SECONDS, power_context(power[:8]))
    )
    print(
        f"one node with power (8 x {SAMPLES} x 2): {node_wall * 1e3:.2f} ms wall, "
        f"{node_cpu * 1e3:.2f} ms CPU"
    )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"peak resident memory of this process: {peak_mib:.0f} MiB "
        f"(the two input matrices: {2 * matrix.nbytes / 2**20:.0f} MiB)"
    )
    for name, results in (
        ("utilisation only", classify_matrix(matrix, STEP_SECONDS, util_context)),
        ("utilisation and power", classify_matrix(matrix, STEP_SECONDS, context)),
    ):
        type_right = [r.job_type == label for r, (label, _) in zip(results, labels, strict=True)]
        period_right = [
            r.job_type == label
            and (period is None or abs((r.period_seconds or 0) - period) <= 0.1 * period)
            for r, (label, period) in zip(results, labels, strict=True)
        ]
        print(
            f"engine on the benchmark matrix, {name}: {np.mean(type_right):.1%} job type, "
            f"{np.mean(period_right):.1%} job type + period"
        )

    sample = matrix[:: GPUS // args.baseline_series][: args.baseline_series]
    started = time.process_time()
    for row in sample:
        pandas_per_lag(row)
    baseline = (time.process_time() - started) / len(sample)
    print(
        f"baseline (pandas Series.autocorr per lag, {SAMPLES // 2} lags): "
        f"{baseline * 1e3:.1f} ms CPU per series over {len(sample)} series"
    )
    print(f"speed-up per series: {baseline / per_series:,.0f}x")

    corpus = list(signals.labelled_corpus())
    engine_type, engine_both = accuracy(corpus, engine_verdicts(corpus))
    reference = [alnair_classify(case.values, case.step_seconds) for case in corpus]
    reference_type, reference_both = accuracy(corpus, reference)
    print(
        f"corpus ({len(corpus)} signals): engine {engine_type:.1%} job type, "
        f"{engine_both:.1%} job type + period; reference rule {reference_type:.1%} job type, "
        f"{reference_both:.1%} job type + period"
    )

    drawn = [case for seed in range(1, args.seeds + 1) for case in signals.labelled_corpus(seed)]
    drawn_type, drawn_both = accuracy(drawn, engine_verdicts(drawn))
    print(
        f"engine on {args.seeds} more corpus draws ({len(drawn)} signals): "
        f"{drawn_type:.1%} job type, {drawn_both:.1%} job type + period"
    )
    for corpus_name, make in (
        ("multi-GPU job corpus", jobs.labelled_jobs),
        ("bare-metal job corpus", jobs.bare_metal_jobs),
    ):
        for seeds in ((jobs.DEFAULT_SEED,), range(1, args.seeds + 1)):
            found = [
                right
                for seed in seeds
                for job in make(seed)
                for right in job.rights(classify_matrix(job.util, job.step_seconds, job.context()))
            ]
            print(
                f"engine on the {corpus_name}, {len(seeds)} draw(s) ({len(found)} GPUs): "
                f"{np.mean(found):.1%} job type and period"
            )
    for name, rate in false_training_rates(np.random.default_rng(1), 1000):
        print(f"called training (1,000 draws): {name}: {rate:.1%}")


if __name__ == "__main__":
    main()
