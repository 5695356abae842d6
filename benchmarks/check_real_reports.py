"""``gpu-profiler trace`` on real Nsight Systems exports, checked against independent readings.

Run by hand (the exports are other projects' public test data, never copied here):

    git clone https://github.com/hpcgroup/pipit /tmp/pipit
    git clone https://github.com/GindaChen/nsys-ai /tmp/nsys-ai
    PYTHONPATH=. .venv/bin/python benchmarks/check_real_reports.py \\
        --pipit /tmp/pipit --nsys-ai /tmp/nsys-ai

The reports are taken from those clones' history (``git show COMMIT:PATH``):

- pipit ``saxpy``: an MPI saxpy run on one A100, Nsight Systems 2022.2 (export schema 2.9.1),
  with CUDA backtraces and the MPI trace; ``cloverleaf``: CloverLeaf on one A100, 2024.5
  (schema 3.13.2), with pipit's own reading of it as CSV;
- nsys-ai ``h100-2gpu``, ``mfu-before``, ``mfu-after``: windows (1 s, 0.3 s) cut from real
  PyTorch captures on two H100s (Nsight Systems 2026.2, schema 3.25.0), and ``mock``: a tiny
  real capture on an RTX 3080.

Each summary is compared, GPU by GPU, with a plain reading of the same export in Python (every
interval loaded, sorted and merged; calls counted per name, CUDA backtrace rows left out;
launches matched by process and correlationId in a dict; NCCL kernels by their name's prefix,
and the time they ran alone as the union with them less the union without them), a second
implementation that catches a wrong join, union or grouping in the numpy code; and, for
CloverLeaf, with pipit's CSV, a reading by another project's code. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import csv
import io
import sqlite3
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from profiler_app.trace import schema
from profiler_app.trace.export import open_report
from profiler_app.trace.summary import TraceSummary, summarise


@dataclass(frozen=True)
class Report:
    name: str
    source: str  # which clone: "pipit" or "nsys_ai"
    commit: str
    path: str


PIPIT_CSV = ("ad30bc8498bdd16cc93b4eb8397d5d5bbae3e33b", "pipit/tests/data/cloverleaf-nsys/")
REPORTS = (
    Report(
        "saxpy",
        "pipit",
        "46d41f2a6681112c86f3a090f9241ad05226ed43",
        "pipit/tests/data/saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    ),
    Report("cloverleaf", "pipit", PIPIT_CSV[0], PIPIT_CSV[1] + "perlmutter-cloverleaf-cuda.sqlite"),
    *(
        Report(name, "nsys_ai", "387e5a5d7b81480d720a610670ba7c6615f994b0", f"tests/fixtures/{f}")
        for name, f in (
            ("h100-2gpu", "h100_2gpu_1s.sqlite"),
            ("mfu-before", "mfu_2gpu_before.sqlite"),
            ("mfu-after", "mfu_2gpu_after.sqlite"),
        )
    ),
    Report(
        "mock", "nsys_ai", "85fe0c676142647f06a354ce37f760a735dcb08c", "tests/fixtures/mock.sqlite"
    ),
)
Figures = dict[str, object]
MASK = schema.PROCESS_MASK


def from_git(checkout: Path, commit: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(checkout), "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout


def union(intervals: list[tuple[int, int]]) -> Figures:
    """Busy time and gaps of merged intervals, the plain way."""
    intervals.sort()
    gaps, busy_until, busy = [], intervals[0][1], 0
    stretch_start = intervals[0][0]
    for start, end in intervals[1:]:
        if start > busy_until:
            busy += busy_until - stretch_start
            gaps.append(start - busy_until)
            stretch_start = start
        busy_until = max(busy_until, end)
    busy += busy_until - stretch_start
    return {
        "span_ns": busy_until - intervals[0][0],
        "busy_ns": busy,
        "gaps": len(gaps),
        "idle_ns": sum(gaps),
        "longest_gap_ns": max(gaps, default=0),
    }


def ours(summary: TraceSummary) -> dict[int, Figures]:
    return {
        gpu.device: {
            "span_ns": gpu.span_ns,
            "busy_ns": gpu.busy_ns,
            "gaps": gpu.gaps.count,
            "idle_ns": gpu.gaps.total_ns,
            "longest_gap_ns": gpu.gaps.longest_ns,
            "kernels": sum(k.count for k in gpu.kernels),
            "kernel_ns": sum(k.total_ns for k in gpu.kernels),
            "memory": {m.name: (m.count, m.total_ns, m.bytes) for m in gpu.memory},
            "launches": gpu.launches,
            "launch_ns": gpu.launch_ns,
            "nccl_ns": gpu.communication_ns,
            "nccl_alone_ns": gpu.exposed_communication_ns,
        }
        for gpu in summary.gpus
    }


def tally(entries: dict[str, list[int]], key: str, *values: int) -> None:
    entry = entries.setdefault(key, [0] * len(values))
    for i, value in enumerate(values):
        entry[i] += value


def plain_reading(path: Path) -> tuple[dict[int, Figures], dict[str, tuple[int, ...]]]:
    """Per GPU figures and the CUDA API summary by plain queries and Python."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}

    def columns(table: str) -> set[str]:
        return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}

    def pid(table: str) -> str:
        return "globalPid" if "globalPid" in columns(table) else "NULL"

    intervals: dict[int, list[tuple[int, int]]] = defaultdict(list)
    not_nccl: dict[int, list[tuple[int, int]]] = defaultdict(list)  # all but NCCL kernels
    nccl_ns: dict[int, int] = defaultdict(int)
    memory: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for table in schema.GPU_ACTIVITY_TABLES:
        if table not in tables:
            continue
        kind = "copyKind" if table == schema.MEMCPY else "NULL"
        # NCCL's kernels by their name's prefix (the tool matches a regular expression)
        nccl = (
            f"(SELECT value FROM {schema.STRINGS} WHERE id = demangledName) LIKE 'nccl%'"
            if table == schema.KERNEL
            else "0"
        )
        for device, start, end, op, size, is_nccl in db.execute(
            f"SELECT deviceId, start, end, {kind}, {'bytes' if table != schema.KERNEL else 0}, "
            f"{nccl} FROM {table} WHERE end > start"
        ):
            intervals[device].append((start, end))
            if is_nccl:
                nccl_ns[device] += end - start
            else:
                not_nccl[device].append((start, end))
            if table != schema.KERNEL:
                name = schema.MEMSET_KIND if op is None else schema.MEMCPY_KINDS[op]
                tally(memory[device], name, 1, end - start, size)
    backtraces = schema.CUDA_BACKTRACE_EVENT_CLASSES
    api: dict[str, list[int]] = {}
    calls: dict[tuple[int | None, int], int] = defaultdict(int)  # (process, id) -> ns
    graph_ns: dict[int | None, int] = defaultdict(int)
    for name, process, correlation, length in db.execute(
        f"""SELECT s.value, r.globalTid & {MASK}, r.correlationId, r.end - r.start
            FROM {schema.RUNTIME} AS r JOIN {schema.STRINGS} AS s ON s.id = r.nameId
            WHERE r.eventClass NOT BETWEEN {backtraces[0]} AND {backtraces[-1]}
                  AND r.end >= r.start"""
    ):
        tally(api, schema.api_name(name), 1, length)
        calls[(process, correlation)] += length
        if schema.api_name(name) in schema.GRAPH_LAUNCH_CALLS:
            graph_ns[process] += length
    kernel_pid = pid(schema.KERNEL)
    if kernel_pid == "NULL":  # no kernel process: a call of any process with the same id
        by_id: dict[tuple[int | None, int], int] = defaultdict(int)
        for (_, correlation), ns in calls.items():
            by_id[(None, correlation)] += ns
        calls = by_id
    graph = "coalesce(graphNodeId, 0)" if "graphNodeId" in columns(schema.KERNEL) else "0"
    figures: dict[int, Figures] = {}
    for device, spans in intervals.items():
        kernels = db.execute(
            f"SELECT {kernel_pid}, correlationId, end - start, {graph} FROM {schema.KERNEL} "
            "WHERE deviceId = ? AND end >= start",
            (device,),
        ).fetchall()
        matched = [calls[(p, c)] for p, c, _, node in kernels if node == 0 and (p, c) in calls]
        processes = {p for p, *_ in kernels}
        busy_without_nccl = union(not_nccl[device])["busy_ns"] if not_nccl[device] else 0
        figures[device] = {
            **union(spans),
            "nccl_ns": nccl_ns[device],
            "nccl_alone_ns": union(list(spans))["busy_ns"] - busy_without_nccl,
            "kernels": len(kernels),
            "kernel_ns": sum(length for _, _, length, _ in kernels),
            "memory": {kind: tuple(values) for kind, values in memory[device].items()},
            "launches": len(matched),
            "launch_ns": sum(matched) + sum(graph_ns[p] for p in processes),
        }
    return figures, {name: tuple(values) for name, values in api.items()}


def pipit_reading(checkout: Path, report: Path) -> Figures:
    """CloverLeaf's figures from pipit's CSV reading of it (Enter rows carry their Leave)."""

    def enters(name: str) -> list[dict[str, str]]:
        text = from_git(checkout, PIPIT_CSV[0], PIPIT_CSV[1] + name).decode()
        return [row for row in csv.DictReader(io.StringIO(text)) if row["Event Type"] == "Enter"]

    def interval(row: dict[str, str]) -> tuple[int, int]:
        return int(row["Timestamp (ns)"]), int(row["_matching_timestamp"])

    # pipit names a copy by its ENUM_CUDA_MEMCPY_OPER name (CUDA_MEMCPY_KIND_HTOD)
    with sqlite3.connect(f"file:{report}?mode=ro", uri=True) as db:
        kinds = dict(db.execute("SELECT name, id FROM ENUM_CUDA_MEMCPY_OPER").fetchall())
    gpu = enters("cloverleaf_gpu_trace.csv")
    kernels = [interval(row) for row in gpu if row["type"] == "kernel"]
    memory: dict[str, list[int]] = {}
    for row in gpu:
        if row["type"] != "kernel":
            start, end = interval(row)
            kind = schema.MEMCPY_KINDS[kinds[row["type"]]]
            tally(memory, kind, 1, end - start, int(float(row["bytes"])))
    return {
        **union([interval(row) for row in gpu]),
        "kernels": len(kernels),
        "kernel_ns": sum(end - start for start, end in kernels),
        "memory": {kind: tuple(values) for kind, values in memory.items()},
    }


def pipit_api(checkout: Path) -> dict[str, tuple[int, ...]]:
    text = from_git(checkout, PIPIT_CSV[0], PIPIT_CSV[1] + "cloverleaf-cuda_api_trace.csv")
    api: dict[str, list[int]] = {}
    for row in csv.DictReader(io.StringIO(text.decode())):
        if row["Event Type"] == "Enter":
            length = int(row["_matching_timestamp"]) - int(row["Timestamp (ns)"])
            tally(api, schema.api_name(row["Name"]), 1, length)
    return {name: tuple(values) for name, values in api.items()}


def compare(label: str, mine: Figures, reference: Figures) -> int:
    differences = [key for key in reference if mine.get(key) != reference[key]]
    for key in differences:
        print(f"    DIFFERS from {label}: {key}: ours {mine.get(key)}, {label} {reference[key]}")
    print(f"    {label}: {len(reference) - len(differences)} of {len(reference)} figures agree")
    return len(differences)


def describe(name: str, summary: TraceSummary) -> None:
    iteration = summary.iteration
    found = (
        f"{iteration.seconds * 1e3:.1f} ms ({iteration.source} {iteration.range_name or ''})"
        if iteration
        else "not found"
    )
    print(
        f"{name}: Nsight Systems {summary.product_version}, schema {summary.schema_version}, "
        f"{len(summary.gpus)} GPU(s), iteration {found}"
    )
    for gpu in summary.gpus:
        print(
            f"  GPU {gpu.device}: {sum(k.count for k in gpu.kernels)} kernels, busy "
            f"{gpu.busy_fraction:.1%} of {gpu.span_ns / 1e6:.1f} ms, {gpu.gaps.count} gaps, "
            f"{gpu.launches} launches; verdict {gpu.verdict.name}: {gpu.verdict.evidence[0]}"
        )
        for line in gpu.verdict.evidence[1:]:
            print(f"    {line}")
        whole = sum(share.total_ns for share in gpu.families)
        print(
            "    families: "
            + ", ".join(f"{s.label} {s.percent_of(whole):.1f}%" for s in gpu.families)
            + f"; reading: {gpu.reading}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipit", type=Path, help="a clone of github.com/hpcgroup/pipit")
    parser.add_argument("--nsys-ai", type=Path, help="a clone of github.com/GindaChen/nsys-ai")
    args = parser.parse_args()
    checkouts = {"pipit": args.pipit, "nsys_ai": args.nsys_ai}
    if not any(checkouts.values()):
        parser.error("give --pipit, --nsys-ai or both")
    differences = 0
    with tempfile.TemporaryDirectory() as scratch:
        for report in REPORTS:
            checkout = checkouts[report.source]
            if checkout is None:
                continue
            path = Path(scratch) / f"{report.name}.sqlite"
            path.write_bytes(from_git(checkout, report.commit, report.path))
            with open_report(str(path)) as export:
                summary = summarise(export)
            describe(report.name, summary)
            mine, (plain, plain_api) = ours(summary), plain_reading(path)
            for device, figures in sorted(plain.items()):
                print(f"  GPU {device}:")
                differences += compare("plain reading", mine.get(device, {}), figures)
            api = {s.name: (s.count, s.total_ns) for s in summary.api}
            differences += compare("plain reading", {"api": api}, {"api": plain_api})
            if report.name == "cloverleaf":
                differences += compare("pipit's CSV", mine[0], pipit_reading(checkout, path))
                differences += compare("pipit's CSV", {"api": api}, {"api": pipit_api(checkout)})
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
