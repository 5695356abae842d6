"""Scores ``gpu-profiler analyze --input`` on real GPU traces against their labels.

Run by hand: ``python benchmarks/eval_traces.py`` (from a checkout with ``../shared/traces``).

Every ``*.json`` file in the traces folder is analysed as ``analyze --input FILE --output json``
would (in this process by default; ``--command`` runs another build of the CLI, e.g. an older
checkout's ``gpu-profiler``, once per file). Each GPU's job type is compared with
``truth.json`` (``FILE|Hostname|gpu`` -> ``idle``, ``training`` or ``other``), where ``other``
(inference or bursty serving) is right when the profiler says ``inference`` or ``bursty``.

Printed: every miss, accuracy per label and overall, and pod consistency: the share of pods with
several GPUs in which no GPU is called training while another is called inference or bursty.
The traces are evaluation data only; they are never copied into the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler_app.cli import main as cli_main

DEFAULT_TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
SERVING = {"inference", "bursty"}


def analyse(path: Path, command: list[str] | None) -> list[dict[str, object]]:
    arguments = ["analyze", "--input", str(path), "--output", "json"]
    if command:
        done = subprocess.run(
            [*command, *arguments], capture_output=True, text=True, check=True, timeout=300
        )
        records: list[dict[str, object]] = json.loads(done.stdout)
        return records
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = cli_main(arguments)
    if status != 0:
        raise RuntimeError(f"analyze --input {path} exited with {status}")
    return json.loads(output.getvalue())


def label_of(job_type: str) -> str:
    return "other" if job_type in SERVING else job_type


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument(
        "--command", help="run this CLI instead of this checkout's, e.g. /path/to/gpu-profiler"
    )
    parser.add_argument("--quiet", action="store_true", help="no line per miss")
    args = parser.parse_args()
    truth: dict[str, str] = json.loads((args.traces / "truth.json").read_text())
    command = shlex.split(args.command) if args.command else None

    right: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    pods: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    seen: set[str] = set()
    for path in sorted(args.traces.glob("*.json")):
        if path.name == "truth.json":
            continue
        for record in analyse(path, command):
            key = f"{path.stem}|{record['hostname']}|{record['gpu']}"
            said = str(record["job_type"])
            if record.get("pod"):
                pods[path.stem, str(record["hostname"]), str(record["pod"])].append(said)
            expected = truth.get(key)
            if expected is None:
                continue
            seen.add(key)
            total[expected] += 1
            if label_of(said) == expected:
                right[expected] += 1
            elif not args.quiet:
                why = "; ".join(map(str, record.get("reasons") or []))
                print(f"miss: {key}: expected {expected}, got {said} ({why})")
    for key in sorted(set(truth) - seen):
        print(f"not profiled: {key} (expected {truth[key]})")
        total[truth[key]] += 1

    for label in sorted(total):
        share = right[label] / total[label]
        print(f"{label}: {right[label]} of {total[label]} right ({share:.1%})")
    all_right, all_total = sum(right.values()), sum(total.values())
    print(f"overall: {all_right} of {all_total} right ({all_right / all_total:.1%})")
    several = [set(types) for types in pods.values() if len(types) > 1]
    consistent = sum(not ("training" in types and types & SERVING) for types in several)
    print(f"pod consistency: {consistent} of {len(several)} pods with several GPUs agree")


if __name__ == "__main__":
    main()
