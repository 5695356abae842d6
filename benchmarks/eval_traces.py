"""Scores ``gpu-profiler analyze --input`` on real GPU traces against their labels.

Run by hand: ``python benchmarks/eval_traces.py --traces FOLDER`` (a folder of labelled traces).

Every ``*.json`` file in the traces folder is analysed as ``analyze --input FILE --output json``
would (in this process by default; ``--command`` runs another build of the CLI, e.g. an older
checkout's ``gpu-profiler``, once per file). Each GPU's job type is compared with
``truth.json`` (``FILE|Hostname|gpu`` -> ``idle``, ``training`` or ``other``), where ``other``
(inference or bursty serving) is right when the profiler says ``inference`` or ``bursty``.

Perturbations ask whether the verdicts hold beyond these exact windows, as they must on other
runs: ``--drop-labels pod`` removes labels (a bare-metal exporter has no pod), ``--drop-fields
power`` removes fields (an exporter that sends utilisation alone), ``--sub-windows 0.5`` cuts
every trace into windows of that share of its length, each shifted by half a window, and scores
every one, ``--every 5`` keeps every fifth sample (a coarser scrape). ``--matrix`` runs the
standard set of perturbations and prints one table row each.

Printed: every miss, accuracy per label and overall, the confusion matrix (each label against
the job types said), and job consistency: the share of jobs with several GPUs in which no GPU
is called training while another is called inference or bursty. A job is the pod of the
original trace, whatever labels the perturbation removed.
The traces are evaluation data only; they are never copied into the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler_app.cli import main as cli_main

SERVING = {"inference", "bursty"}
FIELD_ALIASES = {
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "sm-active": "DCGM_FI_PROF_SM_ACTIVE",
    "mem-copy": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "fb-used": "DCGM_FI_DEV_FB_USED",
}
LABELS = ("idle", "training", "other")
JOB_TYPES = ("idle", "training", "inference", "bursty")

Document = dict[str, object]


@dataclass(frozen=True)
class Perturbation:
    """What is taken away from every trace before it is analysed."""

    drop_labels: tuple[str, ...] = ()
    drop_fields: tuple[str, ...] = ()
    window_share: float | None = None  # sub-windows of this share of each trace
    every: int = 1  # keep every n-th sample: a coarser scrape interval

    @property
    def name(self) -> str:
        parts = [f"no {label} label" for label in self.drop_labels]
        parts += [f"no {name}" for name in self.drop_fields]
        if self.every > 1:
            parts.append(f"every {self.every}th sample")
        if self.window_share is not None:
            parts.append(f"sub-windows of {self.window_share:g}")
        return ", ".join(parts) or "as recorded"


MATRIX = (
    Perturbation(),
    Perturbation(drop_labels=("pod",)),
    Perturbation(drop_fields=("power",)),
    Perturbation(drop_labels=("pod",), drop_fields=("power",)),
    Perturbation(window_share=0.5),
    Perturbation(window_share=0.25),
    Perturbation(drop_labels=("pod",), window_share=0.5),
    Perturbation(drop_labels=("pod",), drop_fields=("power",), window_share=0.5),
    Perturbation(every=5),
)


def _series(document: Document) -> list[dict[str, object]]:
    data = document["data"]
    assert isinstance(data, dict)
    result: list[dict[str, object]] = data["result"]
    return result


def variants(document: Document, perturbation: Perturbation) -> Iterator[tuple[str, Document]]:
    """The perturbed documents of one trace, each with a suffix naming its sub-window."""
    fields = {FIELD_ALIASES.get(name, name) for name in perturbation.drop_fields}
    base = copy.deepcopy(document)
    kept = []
    for series in _series(base):
        metric = series["metric"]
        assert isinstance(metric, dict)
        if metric.get("__name__") in fields:
            continue
        for label in perturbation.drop_labels:
            metric.pop(label, None)
        values = series["values"]
        assert isinstance(values, list)
        series["values"] = values[:: perturbation.every]
        kept.append(series)
    _series(base)[:] = kept
    share = perturbation.window_share
    if share is None:
        yield "", base
        return
    times = sorted({float(v[0]) for s in kept for v in s["values"]})  # type: ignore[attr-defined]
    start, length = times[0], (times[-1] - times[0]) * share
    offset = 0.0
    while start + offset + length <= times[-1] + 1e-6:
        low, high = start + offset, start + offset + length
        window = copy.deepcopy(base)
        for series in _series(window):
            values = series["values"]
            assert isinstance(values, list)
            series["values"] = [v for v in values if low <= float(v[0]) <= high]
        _series(window)[:] = [s for s in _series(window) if s["values"]]
        yield f"@{offset / (times[-1] - times[0]):.3g}", window
        offset += length / 2


def analyse(path: Path, command: list[str] | None) -> list[dict[str, object]]:
    arguments = ["analyze", "--input", str(path), "--output", "json"]
    if command:
        done = subprocess.run(
            [*command, *arguments], capture_output=True, text=True, check=True, timeout=300
        )
        return gpu_records(done.stdout)
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(io.StringIO()):
        status = cli_main(arguments)
    if status != 0:
        raise RuntimeError(f"analyze --input {path} exited with {status}")
    return gpu_records(output.getvalue())


def gpu_records(text: str) -> list[dict[str, object]]:
    """The per-GPU records of ``analyze --output json``: the envelope's ``gpus``, or the bare
    array that versions before the envelope printed (``--command`` may run one)."""
    document = json.loads(text)
    records: list[dict[str, object]] = document["gpus"] if isinstance(document, dict) else document
    return records


def label_of(job_type: str) -> str:
    return "other" if job_type in SERVING else job_type


def original_pods(document: Document) -> dict[tuple[str, str], str]:
    """(Hostname, gpu) -> the pod that held the GPU in the recorded trace."""
    pods = {}
    for series in _series(document):
        metric = series["metric"]
        assert isinstance(metric, dict)
        if metric.get("pod"):
            pods[str(metric.get("Hostname", "")), str(metric.get("gpu", ""))] = str(metric["pod"])
    return pods


@dataclass
class Score:
    right: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    jobs: int = 0
    consistent: int = 0
    misses: list[str] = field(default_factory=list)
    confusion: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def share(self, label: str | None = None) -> tuple[int, int]:
        if label is None:
            return sum(self.right.values()), sum(self.total.values())
        return self.right[label], self.total[label]


def score(traces: Path, perturbation: Perturbation, command: list[str] | None) -> Score:
    truth: dict[str, str] = json.loads((traces / "truth.json").read_text())
    result = Score()
    with tempfile.TemporaryDirectory() as scratch:
        for path in sorted(traces.glob("*.json")):
            if path.name == "truth.json":
                continue
            document = json.loads(path.read_text())
            pods = original_pods(document)
            for suffix, variant in variants(document, perturbation):
                target = Path(scratch) / path.name
                target.write_text(json.dumps(variant))
                expected_keys = {k for k in truth if k.startswith(f"{path.stem}|")}
                jobs: dict[str, set[str]] = defaultdict(set)
                for record in analyse(target, command):
                    host, gpu, said = record["hostname"], record["gpu"], str(record["job_type"])
                    key = f"{path.stem}|{host}|{gpu}"
                    if (pod := pods.get((str(host), str(gpu)))) is not None:
                        jobs[pod].add(said)
                    expected = truth.get(key)
                    if expected is None:
                        continue
                    expected_keys.discard(key)
                    result.total[expected] += 1
                    result.confusion[expected, said] += 1
                    if label_of(said) == expected:
                        result.right[expected] += 1
                    else:
                        why = "; ".join(map(str, record.get("reasons") or []))
                        result.misses.append(
                            f"{key}{suffix}: expected {expected}, got {said} ({why})"
                        )
                for key in sorted(expected_keys):
                    result.misses.append(f"{key}{suffix}: not profiled (expected {truth[key]})")
                    result.total[truth[key]] += 1
                    result.confusion[truth[key], "not profiled"] += 1
                several = [said for pod, said in jobs.items() if _gpus(pods, pod) > 1]
                result.jobs += len(several)
                result.consistent += sum(not ("training" in s and s & SERVING) for s in several)
    return result


def _gpus(pods: dict[tuple[str, str], str], pod: str) -> int:
    return sum(1 for held in pods.values() if held == pod)


def _percent(right: int, total: int) -> str:
    return f"{right} of {total} ({right / total:.1%})" if total else "-"


def confusion_table(result: Score) -> list[str]:
    """The confusion matrix as Markdown: one row per label, one column per job type said."""
    said = list(JOB_TYPES)
    said += sorted({name for _, name in result.confusion if name not in JOB_TYPES})
    lines = ["| label \\ said | " + " | ".join(said) + " |", "| --- " * (len(said) + 1) + "|"]
    for label in LABELS:
        cells = [str(result.confusion.get((label, name), 0)) for name in said]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def report(perturbation: Perturbation, result: Score, quiet: bool) -> None:
    print(f"== {perturbation.name}")
    if not quiet:
        for miss in result.misses:
            print(f"miss: {miss}")
    for label in LABELS:
        print(f"{label}: {_percent(*result.share(label))} right")
    print(f"overall: {_percent(*result.share())} right")
    print(f"job consistency: {result.consistent} of {result.jobs} jobs with several GPUs agree")
    print("\n".join(confusion_table(result)))


def table(rows: list[tuple[Perturbation, Score]]) -> None:
    print("| perturbation | " + " | ".join(LABELS) + " | overall | jobs agreeing |")
    print("| --- " * (len(LABELS) + 3) + "|")
    for perturbation, result in rows:
        cells = [_percent(*result.share(label)) for label in LABELS]
        cells.append(_percent(*result.share()))
        cells.append(f"{result.consistent} of {result.jobs}")
        print(f"| {perturbation.name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces", type=Path, required=True, help="folder of trace files and their truth.json"
    )
    parser.add_argument(
        "--command", help="run this CLI instead of this checkout's, e.g. /path/to/gpu-profiler"
    )
    parser.add_argument("--quiet", action="store_true", help="no line per miss")
    parser.add_argument(
        "--drop-labels", default="", help="comma-separated labels to remove, e.g. pod"
    )
    parser.add_argument(
        "--drop-fields",
        default="",
        help=f"comma-separated fields to remove ({', '.join(FIELD_ALIASES)} or a DCGM name)",
    )
    parser.add_argument(
        "--sub-windows",
        type=float,
        metavar="SHARE",
        help="score windows of this share (0-1] of each trace, each shifted by half a window",
    )
    parser.add_argument(
        "--every", type=int, default=1, metavar="N", help="keep every N-th sample of each series"
    )
    parser.add_argument(
        "--matrix", action="store_true", help="run the standard perturbations, print a table"
    )
    args = parser.parse_args()
    if args.sub_windows is not None and not 0 < args.sub_windows <= 1:
        parser.error("--sub-windows takes a share between 0 and 1")
    if args.every < 1:
        parser.error("--every takes a whole number of at least 1")
    command = shlex.split(args.command) if args.command else None
    if args.matrix:
        rows = []
        for perturbation in MATRIX:
            result = score(args.traces, perturbation, command)
            report(perturbation, result, args.quiet)
            rows.append((perturbation, result))
        table(rows)
        return
    perturbation = Perturbation(
        tuple(filter(None, args.drop_labels.split(","))),
        tuple(filter(None, args.drop_fields.split(","))),
        args.sub_windows,
        args.every,
    )
    report(perturbation, score(args.traces, perturbation, command), args.quiet)


if __name__ == "__main__":
    main()
