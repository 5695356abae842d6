"""``gpu-profiler trial report``, and the results document ``trial run`` writes: a run's rows
as a table, JSON or CSV, from a results file or the table store."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from profiler_app.core.errors import UserError
from profiler_app.trial.plan import Plan
from profiler_app.trial.results import COLUMNS

# The terminal table; JSON and CSV carry every column.
TABLE_COLUMNS = [
    "trial", "placement", "nodes", "status", "throughput", "unit", "throughput_per_gpu",
    "scaling_efficiency", "gpu_seconds", "pareto", "recommended", "note",
]  # fmt: skip


def load_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise UserError(f"{path} is not JSON: {error}") from None


RESULTS_FORMAT_VERSION = 1  # docs/cli.md: keys are only added within a version


def results_document(
    run_id: str,
    *,
    plan: Plan,
    rows: list[dict[str, Any]],
    recommendation: str,
    gpu_seconds: float,
    budget: float | None,
) -> dict[str, Any]:
    workload = f"{plan.template.kind}/{plan.template.namespace or ''}/{plan.template.name}"
    return {
        "kind": "trial-results",
        "format_version": RESULTS_FORMAT_VERSION,
        "run_id": run_id,
        "workload": workload,
        "recommendation": recommendation,
        "gpu_hours_used": round(gpu_seconds / 3600, 6),
        "budget_gpu_hours": budget,
        "pareto": [row["trial"] for row in rows if row["pareto"]],
        "trials": rows,
    }


def record(
    url: str, run_id: str, plan: Plan, rows: list[dict[str, Any]], recommendation: str
) -> None:
    from profiler_app.sinks.store.trials import TrialStore  # noqa: PLC0415

    workload = f"{plan.template.kind}/{plan.template.namespace or ''}/{plan.template.name}"
    store = TrialStore(url)
    try:
        store.record(
            run_id,
            [{**row, "workload": workload, "recommendation": recommendation} for row in rows],
        )
    finally:
        store.close()


def write(document: dict[str, Any], output: str, out: TextIO) -> None:
    rows = document["trials"]
    if output == "json":
        json.dump(document, out, indent=2, default=str)
        out.write("\n")
        return
    if output == "csv":
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        return
    console = Console(file=out, width=200 if not out.isatty() else None)
    table = Table(title=f"Trials of run {document['run_id']} ({document['workload']})")
    for column in TABLE_COLUMNS:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in TABLE_COLUMNS))
    console.print(table)
    front = ", ".join(document["pareto"]) or "none"
    console.print(f"Pareto front (throughput against GPUs): {front}", highlight=False)
    console.print(f"Recommendation: {document['recommendation']}", highlight=False)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


# -- report ----------------------------------------------------------------------------------


def handle(args: argparse.Namespace) -> int:
    if Path(args.run).is_file():
        document = load_json(args.run)
        if not isinstance(document, dict) or "trials" not in document:
            raise UserError(f"{args.run} is not a results file of gpu-profiler trial run")
    else:
        if args.store_url.strip().lower() == "none":
            raise UserError("a run id is read from the store: give --store-url")
        from profiler_app.sinks.store.trials import TrialStore  # noqa: PLC0415

        store = TrialStore(args.store_url, create=False)
        try:
            rows = store.run_rows(args.run)
        finally:
            store.close()
        if not rows:
            raise UserError(f"no trial run {args.run!r} in the store {store.url}")
        document = {
            "kind": "trial-results",
            "format_version": RESULTS_FORMAT_VERSION,
            "run_id": args.run,
            "workload": rows[0]["workload"],
            "recommendation": rows[0]["recommendation"] or "",
            "pareto": [row["trial"] for row in rows if row["pareto"]],
            "trials": [{column: row.get(column) for column in COLUMNS} for row in rows],
        }
    write(document, args.output, sys.stdout)
    return 0
