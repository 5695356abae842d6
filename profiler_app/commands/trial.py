"""``gpu-profiler trial plan|run|report|clean``: short runs of a training job on other placements,
measured, bounded and cleaned up. docs/trial.md has the rules, the estimators and their limits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.table import Table

from profiler_app.commands import SUMMARIES
from profiler_app.commands.trial_report import (
    handle_report,
    load_json,
    record,
    results_document,
    write,
)
from profiler_app.durations import format_duration, parse_duration
from profiler_app.errors import UserError
from profiler_app.sinks.store.urls import default_store_url
from profiler_app.trial.manifests import (
    API_VERSIONS,
    GLOBAL,
    PER_GPU,
    STRONG,
    WEAK,
    BatchScaling,
    TrialSettings,
    load_template,
    template_warnings,
    trial_manifest,
)
from profiler_app.trial.placement import GpuNode, parse_dims
from profiler_app.trial.plan import Plan, budget_refusal, build_plan
from profiler_app.trial.results import summarise
from profiler_app.urls import without_credentials

DEFAULT_NAMESPACE = "gpu-profiler-trials"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "trial",
        help=SUMMARIES["trial"],
        description="Short trial runs of a Job, PyTorchJob or Pod on other placements: plan the "
        "pruned grid, run it within a GPU-hour budget, report throughput and a recommendation.",
    )
    actions = parser.add_subparsers(dest="trial_action", metavar="ACTION", required=True)
    _plan_parser(actions.add_parser("plan", help="the pruned grid of placements and its cost"))
    _run_parser(actions.add_parser("run", help="run a plan's trials, measure, clean up"))
    _report_parser(actions.add_parser("report", help="a run's results and recommendation"))
    _clean_parser(actions.add_parser("clean", help="delete what a run created"))


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        metavar="FILE",
        help="kubeconfig (env KUBECONFIG; default: the in-cluster service account)",
    )
    parser.add_argument(
        "--namespace",
        default=DEFAULT_NAMESPACE,
        help="the namespace trials run in (default: %(default)s)",
    )


def _store_option(parser: argparse.ArgumentParser) -> None:
    url = os.environ.get("GPU_PROFILER_STORE_URL") or default_store_url()
    shown = without_credentials(url).replace("%", "%%")
    parser.add_argument(
        "--store-url",
        default=url,
        metavar="URL",
        help=f"table store of the results, or 'none' (env GPU_PROFILER_STORE_URL;"
        f" default: {shown})",
    )


def _plan_parser(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="a Job, PyTorchJob or Pod manifest (YAML or JSON)",
    )
    source.add_argument(
        "--workload",
        metavar="NAMESPACE/KIND/NAME",
        help="a running workload, read from the API server and stripped",
    )
    parser.add_argument(
        "--dims",
        nargs="+",
        default=[],
        metavar="DIM=V1,V2",
        help="gpus=1,2,4 layout=packed,spread model=auto|any|NAME,... "
        "per-pod=N,... (default: gpus=1,2,4 layout=packed,spread model=auto)",
    )
    parser.add_argument(
        "--output", default="-", metavar="FILE", help="where to write the plan (default: stdout)"
    )
    parser.add_argument(
        "--nodes",
        metavar="FILE",
        help="plan against saved nodes (kubectl get nodes -o json) instead of the API server",
    )
    parser.add_argument(
        "--per-trial",
        default="10m",
        metavar="DURATION",
        help="each trial's deadline, for the plan's cost (default: %(default)s)",
    )
    parser.add_argument(
        "--budget-gpu-hours",
        type=float,
        metavar="H",
        help="prune the trials past this many GPU-hours (cheapest kept)",
    )
    _scaling_options(parser)
    _grace_option(parser)
    _common(parser)
    parser.set_defaults(handler=_quiet_on_broken_pipe(handle_plan))


def _grace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grace-period",
        default="30s",
        metavar="DURATION",
        help="the most a trial's pods get to stop (terminationGracePeriodSeconds; preStop "
        "hooks are dropped), counted in the budget (default: %(default)s)",
    )


def _scaling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scale",
        choices=(WEAK, STRONG),
        default=WEAK,
        help="weak: each GPU keeps its batch; strong: the global batch is split "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--batch-env",
        metavar="NAME",
        help="the GPU container's environment variable holding the batch the "
        "script reads; rewritten per trial to keep --scale",
    )
    parser.add_argument(
        "--batch-env-scope",
        choices=(PER_GPU, GLOBAL),
        default=PER_GPU,
        help="whether --batch-env holds the per-GPU or the global batch (default: %(default)s)",
    )


def _run_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, metavar="FILE", help="written by trial plan")
    parser.add_argument(
        "--budget-gpu-hours",
        type=float,
        required=True,
        metavar="H",
        help="refuse a plan whose GPUs x deadlines exceed this",
    )
    parser.add_argument(
        "--per-trial",
        default="10m",
        metavar="DURATION",
        help="each trial's deadline, warm-up included (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        default="3m",
        metavar="DURATION",
        help="discarded at the start of each trial (default: %(default)s)",
    )
    parser.add_argument(
        "--parallel", type=int, default=1, metavar="N", help="trials at once (default: %(default)s)"
    )
    parser.add_argument(
        "--pending-timeout",
        default="2m",
        metavar="DURATION",
        help="a trial pending longer is deleted as unschedulable (default: %(default)s)",
    )
    parser.add_argument(
        "--max-gpus",
        type=int,
        metavar="N",
        help="the namespace's GPU quota when the run creates it (default: the "
        "largest trial's GPUs x --parallel)",
    )
    parser.add_argument(
        "--allow-scale-up",
        action="store_true",
        help="let trials go to nodes that do not exist yet (Karpenter may "
        "launch them); by default they may only use the nodes the plan found",
    )
    parser.add_argument(
        "--read-only-volumes",
        action="store_true",
        help="mount the template's hostPath, NFS, CSI and PersistentVolumeClaim volumes "
        "read-only in trials",
    )
    _grace_option(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the objects a run would create, and create nothing",
    )
    group = parser.add_argument_group("measuring, in order of preference")
    group.add_argument(
        "--metric",
        metavar="NAME",
        help="a rate the job prints as NAME=VALUE lines (Katib's format)",
    )
    group.add_argument(
        "--metric-query",
        metavar="PROMQL",
        help="a rate in PromQL over the trial's pods ($POD: their names as a regular expression)",
    )
    group.add_argument(
        "--step-regex", metavar="REGEX", help="a log line matching this marks a step"
    )
    group.add_argument(
        "--prometheus-url",
        default=os.environ.get("GPU_PROFILER_PROMETHEUS_URL") or None,
        metavar="URL",
        help="Prometheus with dcgm-exporter's series, for "
        "--metric-query, the iteration period, SM activity and peaks (env "
        "GPU_PROFILER_PROMETHEUS_URL)",
    )
    group.add_argument(
        "--metrics-step",
        default="10s",
        metavar="DURATION",
        help="dcgm-exporter's sampling interval (default: %(default)s)",
    )
    parser.add_argument(
        "--poll",
        default="5s",
        metavar="DURATION",
        help="how often trials are checked (default: %(default)s)",
    )
    parser.add_argument("--results", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--output",
        choices=("table", "json", "csv"),
        default="table",
        help="format of the summary on stdout (default: %(default)s)",
    )
    _store_option(parser)
    _common(parser)
    parser.set_defaults(handler=_quiet_on_broken_pipe(handle_run))


def _report_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        metavar="RUN_ID_OR_FILE",
        help="a run id (from the store), or a results file of trial run",
    )
    parser.add_argument(
        "--output",
        choices=("table", "json", "csv"),
        default="table",
        help="output format (default: %(default)s)",
    )
    _store_option(parser)
    parser.set_defaults(handler=_quiet_on_broken_pipe(handle_report))


def _clean_parser(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("run", nargs="?", metavar="RUN_ID", help="the run to remove")
    which.add_argument(
        "--older-than", metavar="DURATION", help="remove every run started at least this long ago"
    )
    which.add_argument(
        "--expired",
        action="store_true",
        help="remove every run past the end its anchor states (what the next run collects)",
    )
    _common(parser)
    parser.set_defaults(handler=_quiet_on_broken_pipe(handle_clean))


def _quiet_on_broken_pipe(handler: Any) -> Any:
    """Stop quietly when the reader of a pipe (e.g. ``head``) has gone."""

    def handle(args: argparse.Namespace) -> int:
        try:
            status: int = handler(args)
            sys.stdout.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        return status

    return handle


def _duration(text: str, flag: str) -> float:
    try:
        return parse_duration(text)
    except UserError as error:
        raise UserError(f"{flag}: {error}") from None


def _grace(text: str) -> int:
    seconds = _duration(text, "--grace-period")
    if seconds < 0:
        raise UserError(f"--grace-period {text!r} must not be negative")
    return round(seconds)


def _read_document(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise UserError(f"{path} is not YAML or JSON: {' '.join(str(error).split())}") from None
    workloads = [d for d in documents if isinstance(d, dict) and d.get("kind") in API_VERSIONS]
    if len(documents) == 1:
        return documents[0]
    if len(workloads) != 1:
        raise UserError(
            f"{path} holds {len(documents)} documents; give it one Job, PyTorchJob or Pod"
        )
    return workloads[0]


def _connect(kubeconfig: str | None) -> Any:
    from profiler_app import kube  # noqa: PLC0415
    from profiler_app.trial.cluster import TrialCluster  # noqa: PLC0415

    connection = kube.connect(kubeconfig)
    if connection is None:
        raise UserError(
            "no Kubernetes API: give --kubeconfig (or set KUBECONFIG), or run in a "
            "pod with a service account"
        )
    return TrialCluster(connection)


def _api_errors() -> tuple[type[Exception], ...]:
    from profiler_app.trial.cluster import ApiError, UnavailableError  # noqa: PLC0415
    from profiler_app.trial.guards import GuardError  # noqa: PLC0415

    return (ApiError, UnavailableError, GuardError)


# -- plan -------------------------------------------------------------------------------------


def handle_plan(args: argparse.Namespace) -> int:
    dims = parse_dims(args.dims)
    per_trial = _duration(args.per_trial, "--per-trial")
    grace = _grace(args.grace_period)
    if args.budget_gpu_hours is not None and args.budget_gpu_hours <= 0:
        raise UserError("--budget-gpu-hours must be positive")
    scaling = BatchScaling(args.scale, args.batch_env, args.batch_env_scope)
    cluster = None
    if args.from_file:
        template = load_template(_read_document(args.from_file), args.from_file)
        source = args.from_file
    else:
        namespace, kind, name = _workload_ref(args.workload)
        cluster = _connect(args.kubeconfig)
        try:
            document = cluster.workload(namespace, kind, name)
        except _api_errors() as error:
            raise UserError(f"cannot read {args.workload}: {error}") from None
        template = load_template(document, args.workload)
        source = args.workload
    if args.nodes:
        listed = _read_document(args.nodes)
        items = listed.get("items", []) if isinstance(listed, dict) else []
    else:
        cluster = cluster or _connect(args.kubeconfig)
        try:
            items = cluster.nodes()
        except _api_errors() as error:
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
        grace_seconds=grace,
    )
    for warning in template_warnings(template, args.namespace, grace):
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


# -- run --------------------------------------------------------------------------------------


def _run_options(args: argparse.Namespace, plan: Plan) -> Any:
    """The run's options, checked (the budget before anything is created)."""
    from profiler_app.trial.run_options import RunOptions  # noqa: PLC0415

    per_trial = _duration(args.per_trial, "--per-trial")
    warmup = _duration(args.warmup, "--warmup")
    if warmup >= per_trial:
        raise UserError("--warmup must be shorter than --per-trial")
    if args.parallel < 1:
        raise UserError("--parallel must be 1 or more")
    if args.budget_gpu_hours <= 0:
        raise UserError("--budget-gpu-hours must be positive")
    if not plan.trials:
        raise UserError(f"{args.plan} has no trials to run (every placement was pruned)")
    grace = _grace(args.grace_period)
    placements = [t.placement for t in plan.trials]
    refusal = budget_refusal(placements, per_trial, args.budget_gpu_hours, grace)
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
        pending_timeout_seconds=_duration(args.pending_timeout, "--pending-timeout"),
        parallel=args.parallel,
        allow_scale_up=args.allow_scale_up,
        poll_seconds=_duration(args.poll, "--poll"),
        max_gpus=args.max_gpus,
        grace_seconds=grace,
        read_only_volumes=args.read_only_volumes,
    )


def handle_run(args: argparse.Namespace) -> int:
    from profiler_app.trial.measuring import Measuring  # noqa: PLC0415
    from profiler_app.trial.runner import TrialRun, new_run_id  # noqa: PLC0415

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
        from profiler_app.trial.metrics import TrialMetrics  # noqa: PLC0415

        metrics = TrialMetrics(args.prometheus_url, _duration(args.metrics_step, "--metrics-step"))
        if args.metric_query:
            metrics.check(args.metric_query)
    measuring = Measuring(args.metric, args.metric_query, step_regex, metrics)
    cluster = _connect(args.kubeconfig)
    from profiler_app.trial.progress import progress_for  # noqa: PLC0415

    with progress_for() as progress:
        run = TrialRun(plan, options, cluster, measuring, progress=progress)
        received: list[int] = []
        previous = _stop_on_signals(run, received)
        try:
            outcome = run.run()
        except _api_errors() as error:
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


def _warn_about_template(plan: Plan, options: Any) -> None:
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


def _dry_run(plan: Plan, options: Any, run_id: str) -> None:
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


def _stop_on_signals(run: Any, received: list[int]) -> dict[int, Any]:
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


# -- clean ------------------------------------------------------------------------------------


def handle_clean(args: argparse.Namespace) -> int:
    from profiler_app.trial.collect import (  # noqa: PLC0415
        collect_runs,
        delete_run,
        found_runs,
        remaining_objects,
    )

    cluster = _connect(args.kubeconfig)
    now = time.time()
    try:
        if args.run:
            delete_run(cluster, args.namespace, args.run)
            left = remaining_objects(cluster, args.namespace, args.run)
            print(
                f"gpu-profiler: run {args.run}: deleted"
                + (f"; still going: {', '.join(left)}" if left else ""),
                file=sys.stderr,
            )
            return 0
        older = None if args.expired else _duration(args.older_than, "--older-than")
        found = found_runs(cluster, args.namespace)
        runs = collect_runs(cluster, args.namespace, now, older_than=older)
    except _api_errors() as error:
        raise UserError(f"trial clean: {error}") from None
    which = "past their end" if args.expired else f"older than {args.older_than}"
    print(
        f"gpu-profiler: removed {len(runs)} run(s) {which}"
        + (f": {', '.join(runs)}" if runs else ""),
        file=sys.stderr,
    )
    for run, created, expires in found:  # what is left, and when the next run collects it
        if run in runs:
            continue
        started = (
            "start unknown" if created is None else f"started {format_duration(now - created)} ago"
        )
        ends = (
            "no stated end"
            if expires is None
            else f"collected by the next run in {format_duration(max(0.0, expires - now))}"
        )
        print(f"gpu-profiler: kept run {run}: {started}; {ends}", file=sys.stderr)
    return 0
