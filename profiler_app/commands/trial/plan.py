"""``gpu-profiler trial plan``: the pruned grid of placements for one workload and its cost,
as JSON for ``trial run`` and as a table on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.table import Table

from profiler_app.commands.trial.common import api_errors, connect, duration, grace, read_document
from profiler_app.core.durations import format_duration
from profiler_app.core.errors import UserError
from profiler_app.trial.manifests import (
    API_VERSIONS,
    BatchScaling,
    load_template,
    template_warnings,
)
from profiler_app.trial.placement import GpuNode, parse_dims
from profiler_app.trial.plan import Plan, build_plan


def handle(args: argparse.Namespace) -> int:
    dims = parse_dims(args.dims)
    per_trial = duration(args.per_trial, "--per-trial")
    grace_seconds = grace(args.grace_period)
    if args.budget_gpu_hours is not None and args.budget_gpu_hours <= 0:
        raise UserError("--budget-gpu-hours must be positive")
    scaling = BatchScaling(args.scale, args.batch_env, args.batch_env_scope)
    cluster = None
    if args.from_file:
        template = load_template(read_document(args.from_file), args.from_file)
        source = args.from_file
    else:
        namespace, kind, name = _workload_ref(args.workload)
        cluster = connect(args.kubeconfig)
        try:
            document = cluster.workload(namespace, kind, name)
        except api_errors() as error:
            raise UserError(f"cannot read {args.workload}: {error}") from None
        template = load_template(document, args.workload)
        source = args.workload
    if args.nodes:
        listed = read_document(args.nodes)
        items = listed.get("items", []) if isinstance(listed, dict) else []
    else:
        cluster = cluster or connect(args.kubeconfig)
        try:
            items = cluster.nodes()
        except api_errors() as error:
            raise UserError(f"cannot list nodes: {error}") from None
    nodes = [node for node in (GpuNode.from_api(item) for item in items) if node is not None]
    plan = build_plan(
        template,
        dims,
        nodes,
        per_trial_seconds=per_trial,
        scaling=scaling,
        budget_gpu_hours=args.budget_gpu_hours,
        source=source,
        grace_seconds=grace_seconds,
    )
    for warning in template_warnings(template, args.namespace, grace_seconds):
        print(f"gpu-profiler: warning: {warning}", file=sys.stderr)
    _print_plan(plan, sys.stderr)
    text = json.dumps(plan.to_json(), indent=2) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"gpu-profiler: plan written to {args.output}", file=sys.stderr)
    return 0


def _workload_ref(text: str) -> tuple[str, str, str]:
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise UserError(f"--workload takes NAMESPACE/KIND/NAME, got {text!r}")
    namespace, kind, name = parts
    canonical = {k.lower(): k for k in API_VERSIONS}
    if kind.lower().rstrip("s") not in canonical:
        raise UserError(f"--workload: unknown kind {kind!r}: use Job, PyTorchJob or Pod")
    return namespace, canonical[kind.lower().rstrip("s")], name


def _print_plan(plan: Plan, out: TextIO) -> None:
    console = Console(file=out, width=200 if not out.isatty() else None)
    table = Table(
        title=f"Trial plan for {plan.template.kind} {plan.template.name}: "
        f"{len(plan.trials)} trials, {plan.gpu_hours():.2f} GPU-hours at most "
        f"({format_duration(plan.per_trial_seconds)} each, then at most "
        f"{format_duration(plan.grace_seconds)} to stop)"
    )
    for column in ("#", "placement", "nodes", "GPU-hours", "pruned because"):
        table.add_column(column)
    for trial in plan.trials:
        hours = trial.placement.gpus * (plan.per_trial_seconds + plan.grace_seconds) / 3600
        table.add_row(
            str(trial.index), trial.placement.describe(), str(trial.nodes_used), f"{hours:.2f}", ""
        )
    for pruned in plan.pruned:
        table.add_row("-", pruned.placement.describe(), "", "", pruned.reason)
    console.print(table)
