"""How the input-bound hint behaves on real training stalls (docs/analysis.md, "Input-bound hint").

No public trace pairs a GPU's utilisation with its pod's disk reads, so the reads are generated
and the stalls are real: every GPU labelled ``training`` in ``truth.json`` of the development set,
its utilisation as recorded. For each GPU:

- chance: read bursts at random samples (5, 15 and 30 % of them, 50 seeds each), unrelated to
  the stalls: every hint is a false positive;
- offset: bursts with the stalls' own rhythm, half a stall gap late (a loader prefetching
  mid-compute): every hint is a false positive;
- input-bound: a burst in the sample before 70 % of the real stall onsets (50 seeds): every
  missed hint is a false negative.

Usage: python benchmarks/input_bound_chance.py --traces FOLDER
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from profiler_app.analysis.io import MIN_EPISODES, STALL_SHARE, input_bound_reason
from profiler_app.core.model import DISK_READ, GPU_UTIL, PodIoSeries

MB = 1e6
SEEDS = 50
DENSITIES = (0.05, 0.15, 0.3)


def training_gpus(traces: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    truth = json.loads((traces / "truth.json").read_text())
    found = []
    for key, label in sorted(truth.items()):
        if label != "training":
            continue
        name, host, gpu = key.split("|")
        document = json.loads((traces / f"{name}.json").read_text())
        for series in document["data"]["result"]:
            metric = series["metric"]
            if metric.get("__name__", GPU_UTIL) != GPU_UTIL:
                continue
            if metric.get("Hostname") == host and metric.get("gpu") == gpu:
                values = np.array([[float(t), float(v)] for t, v in series["values"]])
                found.append((f"{name} gpu {gpu}", values[:, 0], values[:, 1]))
    return found


def onsets(util: np.ndarray) -> np.ndarray:
    stalled = util <= STALL_SHARE * np.percentile(util, 95)
    return np.flatnonzero(stalled & ~np.concatenate(([False], stalled[:-1])))


def hint(times: np.ndarray, util: np.ndarray, bursts: np.ndarray) -> bool:
    reads = np.where(bursts, 200 * MB, 2 * MB)
    return input_bound_reason(util, times, PodIoSeries(times, {DISK_READ: reads})) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    args = parser.parse_args()
    print("| GPU | samples | stall onsets | chance hints | offset hint | input-bound found |")
    print("| --- | --- | --- | --- | --- | --- |")
    totals = np.zeros(4, dtype=int)  # over GPUs with stalls enough to judge
    for name, times, util in training_gpus(args.traces):
        starts = onsets(util)
        chance = 0
        for density in DENSITIES:
            for seed in range(SEEDS):
                rng = np.random.default_rng(seed)
                chance += hint(times, util, rng.random(util.size) < density)
        gap = int(np.median(np.diff(starts))) if starts.size > 2 else 0
        offset = np.zeros(util.size, dtype=bool)
        offset[(starts + gap // 2)[starts + gap // 2 < util.size]] = True
        offset_hint = gap > 1 and hint(times, util, offset)
        found = 0
        for seed in range(SEEDS):
            rng = np.random.default_rng(seed)
            chosen = starts[rng.random(starts.size) < 0.7] - 1
            bursts = np.zeros(util.size, dtype=bool)
            bursts[chosen[chosen >= 0]] = True
            found += hint(times, util, bursts)
        trials = len(DENSITIES) * SEEDS
        if starts.size >= MIN_EPISODES:
            totals += (chance, trials, found, SEEDS)
        print(
            f"| {name} | {util.size} | {starts.size} | {chance}/{trials} | "
            f"{'yes' if offset_hint else 'no'} | {found}/{SEEDS} |"
        )
    print(
        f"\nGPUs with at least {MIN_EPISODES} stall onsets: chance hints {totals[0]}/{totals[1]}, "
        f"input-bound found {totals[2]}/{totals[3]}"
    )


if __name__ == "__main__":
    main()
