"""``gpu-profiler trial plan|run|report|clean``: short runs of a training job on other placements,
measured, bounded and cleaned up. docs/trial.md has the rules, the estimators and their limits.

This module parses; each verb's handler is in its own module (``plan``, ``run``, ``report``,
``clean``), imported when the verb runs: ``--help`` loads neither the Kubernetes client, the
runner, numpy nor the store.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from profiler_app.commands import SUMMARIES
from profiler_app.core.urls import without_credentials
from profiler_app.sinks.store.urls import default_store_url
from profiler_app.trial.manifests import GLOBAL, PER_GPU, STRONG, WEAK

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
    parser.set_defaults(handler=_handler("plan"))


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
    parser.set_defaults(handler=_handler("run"))


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
    parser.set_defaults(handler=_handler("report"))


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
    parser.set_defaults(handler=_handler("clean"))


def _handler(verb: str) -> Callable[[argparse.Namespace], int]:
    """The module ``verb``'s ``handle``, imported when it runs; it stops quietly when the
    reader of a pipe (e.g. ``head``) has gone."""

    def handle(args: argparse.Namespace) -> int:
        module = importlib.import_module(f"{__name__}.{verb}")
        try:
            status: int = module.handle(args)
            sys.stdout.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
        return status

    return handle
