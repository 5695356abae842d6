"""``gpu-profiler trial run``: a plan's trials run within the GPU-hour budget, measured, then
summarised (table, JSON or CSV), recorded in the store and cleaned up; ``--dry-run`` prints the
objects instead. docs/trial.md has the rules."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from profiler_app.commands.trial.common import api_errors, connect, duration, grace
from profiler_app.commands.trial.report import load_json, record, results_document, write
from profiler_app.core.errors import UserError
from profiler_app.trial.manifests import TrialSettings, template_warnings, trial_manifest
from profiler_app.trial.measuring import Measuring
from profiler_app.trial.metrics import TrialMetrics
from profiler_app.trial.plan import Plan, budget_refusal
from profiler_app.trial.progress import progress_for
from profiler_app.trial.results import summarise
from profiler_app.trial.run_options import RunOptions
from profiler_app.trial.runner import TrialRun, new_run_id


def handle(args: argparse.Namespace) -> int:
    plan = Plan.from_json(load_json(args.plan), args.plan)
    options = _run_options(args, plan)
    step_regex = _regex(args.step_regex)
    _warn_about_template(plan, options)
    if args.dry_run:
        _dry_run(plan, options, new_run_id())
        return 0
    store_url = None if args.store_url.strip().lower() == "none" else args.store_url.strip()
    metrics = None
    if args.prometheus_url:
        metrics = TrialMetrics(args.prometheus_url, duration(args.metrics_step, "--metrics-step"))
        if args.metric_query:
            metrics.check(args.metric_query)
    measuring = Measuring(args.metric, args.metric_query, step_regex, metrics)
    cluster = connect(args.kubeconfig)
    with progress_for() as progress:
        run = TrialRun(plan, options, cluster, measuring, progress=progress)
        received: list[int] = []
        previous = _stop_on_signals(run, received)
        try:
            outcome = run.run()
        except api_errors() as error:
            raise UserError(f"trial run {run.run_id}: {error}") from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if metrics is not None:
                metrics.close()
    summary = summarise(outcome.results, plan.scaling.scale)
    document = results_document(
        outcome.run_id,
        plan=plan,
        rows=summary.rows(),
        recommendation=summary.recommendation,
        gpu_seconds=outcome.gpu_seconds,
        budget=args.budget_gpu_hours,
    )
    if store_url is not None:
        record(store_url, outcome.run_id, plan, summary.rows(), summary.recommendation)
    if args.results:
        Path(args.results).write_text(json.dumps(document, indent=2, default=str) + "\n")
    write(document, args.output, sys.stdout)
    print(
        f"gpu-profiler: run {outcome.run_id}: {len(outcome.results)} trials, "
        f"{outcome.gpu_seconds / 3600:.3f} of {args.budget_gpu_hours:g} GPU-hours used",
        file=sys.stderr,
    )
    if outcome.leftovers:
        print(
            f"gpu-profiler: error: could not delete {', '.join(outcome.leftovers)}; their "
            f"deadlines end them, or run: gpu-profiler trial clean {outcome.run_id}",
            file=sys.stderr,
        )
        return 1
    if outcome.stopped:
        return 128 + (received[0] if received else signal.SIGINT)  # the shell's convention
    return 0


def _run_options(args: argparse.Namespace, plan: Plan) -> RunOptions:
    """The run's options, checked (the budget before anything is created)."""
    per_trial = duration(args.per_trial, "--per-trial")
    warmup = duration(args.warmup, "--warmup")
    if warmup >= per_trial:
        raise UserError("--warmup must be shorter than --per-trial")
    if args.parallel < 1:
        raise UserError("--parallel must be 1 or more")
    if args.budget_gpu_hours <= 0:
        raise UserError("--budget-gpu-hours must be positive")
    if not plan.trials:
        raise UserError(f"{args.plan} has no trials to run (every placement was pruned)")
    grace_seconds = grace(args.grace_period)
    placements = [t.placement for t in plan.trials]
    refusal = budget_refusal(placements, per_trial, args.budget_gpu_hours, grace_seconds)
    if refusal:
        raise UserError(refusal)
    if not (args.metric or args.metric_query or args.step_regex or args.prometheus_url):
        raise UserError(
            "no way to measure throughput: give --metric, --step-regex, or "
            "--prometheus-url (with --metric-query, or for the iteration period)"
        )
    if args.metric_query and not args.prometheus_url:
        raise UserError("--metric-query needs --prometheus-url")
    return RunOptions(
        budget_gpu_hours=args.budget_gpu_hours,
        namespace=args.namespace,
        per_trial_seconds=per_trial,
        warmup_seconds=warmup,
        pending_timeout_seconds=duration(args.pending_timeout, "--pending-timeout"),
        parallel=args.parallel,
        allow_scale_up=args.allow_scale_up,
        poll_seconds=duration(args.poll, "--poll"),
        max_gpus=args.max_gpus,
        grace_seconds=grace_seconds,
        read_only_volumes=args.read_only_volumes,
    )


def _warn_about_template(plan: Plan, options: RunOptions) -> None:
    warnings = template_warnings(plan.template, options.namespace, options.grace_seconds)
    if options.read_only_volumes:  # they are mounted read-only: nothing to warn about
        warnings = [w for w in warnings if "writable (volume" not in w]
    for warning in warnings:
        print(f"gpu-profiler: warning: {warning}", file=sys.stderr)


def _regex(text: str | None) -> re.Pattern[str] | None:
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as error:
        raise UserError(f"--step-regex {text!r}: {error}") from None


def _dry_run(plan: Plan, options: RunOptions, run_id: str) -> None:
    settings = TrialSettings(
        namespace=options.namespace,
        run_id=run_id,
        priority_class=options.priority_class,
        deadline_seconds=int(options.per_trial_seconds),
        ttl_seconds=options.ttl_seconds,
        anchor_name=f"trial-run-{run_id}",
        anchor_uid="<the anchor's uid>",
        allow_scale_up=options.allow_scale_up,
        grace_seconds=options.grace_seconds,
        read_only_volumes=options.read_only_volumes,
    )
    manifests = [
        trial_manifest(
            plan.template,
            trial.placement,
            settings,
            index=trial.index,
            hostnames=trial.hostnames,
            scaling=plan.scaling,
        )
        for trial in plan.trials
    ]
    yaml.safe_dump_all(manifests, sys.stdout, sort_keys=False)
    print(f"gpu-profiler: dry run: {len(manifests)} trials, nothing created", file=sys.stderr)


def _stop_on_signals(run: TrialRun, received: list[int]) -> dict[int, Any]:
    """Ctrl-C and SIGTERM stop the run; its cleanup then deletes every trial."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        print(
            f"gpu-profiler: {signal.Signals(signum).name}: stopping, deleting every trial",
            file=sys.stderr,
        )
        received.append(signum)
        run.stop()

    previous: dict[int, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, request_stop)
    return previous
