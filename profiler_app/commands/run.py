"""``gpu-profiler run``: profile this node continuously (or ``--once``) and publish the results.

Without ``--prometheus-url`` it samples this machine itself through NVML and psutil; without a
kubeconfig or in-cluster service account it leaves Kubernetes alone; the table store defaults to
a SQLite file under the user's data directory. Every flag but ``--once`` falls
back to an environment variable.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from profiler_app.commands import SUMMARIES, options
from profiler_app.core.annotations import DEFAULT_DOMAIN, validate_domain
from profiler_app.core.durations import format_duration
from profiler_app.core.errors import UserError
from profiler_app.core.gpu_resources import DEFAULT_GPU_RESOURCES, GpuResources
from profiler_app.core.urls import without_credentials

# The daemon, its sources and sinks load in _build: `run --help` needs none of them.
if TYPE_CHECKING:
    from profiler_app.daemon import Daemon
    from profiler_app.sinks import Sink
    from profiler_app.sources import MetricsSource
    from profiler_app.sources.gfd import NodeSharing
    from profiler_app.sources.host import HostSampler
    from profiler_app.sources.kube_pods import PodWatcher

# Imported only when used, to keep the daemon small: the Kubernetes client (about 30 MiB), the
# store (its DB-API driver; SQLAlchemy and Alembic only in the migration's child process), and
# local mode's NVML, psutil and rich table (about 5 MiB; the DaemonSet has no terminal).

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9401  # 9400 is dcgm-exporter's
DEFAULT_METRICS_ADDRESS = "127.0.0.1"  # nothing exposed unless asked (the DaemonSet asks)
DEFAULT_INTERVAL = "30s"
DEFAULT_SAMPLE_INTERVAL = "1s"
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
# Raw rows serve the report's edges and recent detail; the hourly and daily rollups serve
# history (docs/store.md, "Retention").
DEFAULT_RETENTION = "14d"
DEFAULT_ROLLUP_RETENTION = "400d"
# A PostgreSQL store is a cluster's, written by every GPU node: a row per GPU every 5 minutes
# (not every 30 s cycle) is a tenth of the rows, writes and report reads, for the same hours.
DEFAULT_POSTGRESQL_STORE_INTERVAL = 300.0
LOG_LEVELS = ("debug", "info", "warning", "error")
PROTECT_TRAINING_ENV = "GPU_PROFILER_PROTECT_TRAINING"
# --protect-training: on (the flag alone), off, or release (protect nothing, remove what the
# profiler set on this node: the DaemonSet's mode once the option is turned off).
PROTECT, NO_PROTECTION, RELEASE_PROTECTION = "on", "off", "release"
PROTECTION_MODES = {"true": PROTECT, "1": PROTECT, "yes": PROTECT, "on": PROTECT}
PROTECTION_MODES |= {"false": NO_PROTECTION, "0": NO_PROTECTION, "no": NO_PROTECTION}
PROTECTION_MODES |= {"off": NO_PROTECTION, "": NO_PROTECTION, "release": RELEASE_PROTECTION}
# Each Prometheus request's timeout: a hung Prometheus costs a cycle this long per query, and
# a stop request then abandons the cycle after daemon.STOP_GRACE_SECONDS.
PROMETHEUS_TIMEOUT_SECONDS = 4.0
# How long the daemon waits for the first pod list before its first cycle; later, cycles go on
# without pods (none annotated, protected or stored) until it comes, and /healthz says so.
POD_SYNC_TIMEOUT_SECONDS = 5.0
# /healthz fails when no cycle was attempted for this many intervals (and at least a minute).
STALE_INTERVALS = 3
# Floors: a cycle sends Prometheus a query_range per field (a few requests a second at most
# at 0.5 s); NVML's utilisation counters move no faster than the sample floor.
MIN_PROMETHEUS_INTERVAL_SECONDS = 0.5
MIN_SAMPLE_INTERVAL_SECONDS = 0.1
# A cycle a day at least: /healthz and the back-off's waits are multiples of the interval.
MAX_INTERVAL_SECONDS = 86400.0
# Ceiling of samples per GPU that local sampling keeps (6 h at 1 s): the ring buffer is
# allocated whole at start, about 48 bytes per sample and GPU.
MAX_LOCAL_SAMPLES = 21_600


def _log_level(text: str) -> str:
    level = text.strip().lower()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"unknown log level {text!r}: use {', '.join(LOG_LEVELS)}")
    return level


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "run",
        help=SUMMARIES["run"],
        description="Every --interval, classify what each GPU of this node did over the last "
        "--window and publish it to Kubernetes annotations, /metrics, the table store and the "
        "terminal. Without --prometheus-url it samples this machine through NVML and psutil.",
    )
    options.add_prometheus_options(parser)
    group = parser.add_argument_group("run")
    add = functools.partial(options.add_env_option, group)
    add(
        "--kubeconfig",
        env="KUBECONFIG",
        shown_default="the in-cluster service account when KUBERNETES_SERVICE_HOST is set, "
        "else Kubernetes is off",
        metavar="FILE",
        help="kubeconfig for pod names and annotations",
    )
    add(
        "--annotation-domain",
        env="GPU_PROFILER_ANNOTATION_DOMAIN",
        default=DEFAULT_DOMAIN,
        metavar="DOMAIN",
        help="prefix of the annotation keys",
    )
    options.add_store_url_option(group, purpose="table store", none="to keep no rows")
    add(
        "--store-interval",
        env="GPU_PROFILER_STORE_INTERVAL",
        shown_default="5m for PostgreSQL (within --interval and --window), every cycle for SQLite",
        metavar="DURATION",
        help="write the store once per this much time, between --interval and --window; the "
        "next row covers the cycles not written",
    )
    add(
        "--retention",
        env="GPU_PROFILER_RETENTION",
        shown_default=DEFAULT_RETENTION,
        metavar="DURATION",
        help="how long the store keeps raw rows (whole UTC days), or 'none' to keep them forever",
    )
    add(
        "--rollup-retention",
        env="GPU_PROFILER_ROLLUP_RETENTION",
        shown_default=DEFAULT_ROLLUP_RETENTION,
        metavar="DURATION",
        help="how long the store keeps hourly and daily rollups and pods, or 'none'",
    )
    add(
        "--metrics-port",
        env="GPU_PROFILER_METRICS_PORT",
        default=str(DEFAULT_METRICS_PORT),
        type=options.port,
        metavar="PORT",
        help="port of /metrics and /healthz, 0 for none",
    )
    add(
        "--metrics-address",
        env="GPU_PROFILER_METRICS_ADDRESS",
        default=DEFAULT_METRICS_ADDRESS,
        metavar="ADDRESS",
        help="address /metrics listens on; 0.0.0.0 exposes it",
    )
    add(
        "--interval",
        env="GPU_PROFILER_INTERVAL",
        default=DEFAULT_INTERVAL,
        metavar="DURATION",
        help="time between cycles, at least 0.5s when reading Prometheus (0.1s locally), "
        "at most 1d",
    )
    add(
        "--sample-interval",
        env="GPU_PROFILER_SAMPLE_INTERVAL",
        default=DEFAULT_SAMPLE_INTERVAL,
        metavar="DURATION",
        help="local sampling period of NVML and the host, at least 0.1s; local sampling "
        f"keeps at most {MAX_LOCAL_SAMPLES:,} samples of --window",
    )
    add(
        "--cgroup-root",
        env="GPU_PROFILER_CGROUP_ROOT",
        default=DEFAULT_CGROUP_ROOT,
        metavar="DIR",
        help="where the host's cgroup tree is mounted, for per-pod CPU and memory",
    )
    add(
        "--protect-training",
        env=PROTECT_TRAINING_ENV,
        nargs="?",
        const=PROTECT,
        shown_default="off",
        metavar="on|off|release",
        help="set karpenter.sh/do-not-disrupt on this node's pods while they train, remove it "
        "after; 'release' only removes what the profiler set",
    )
    options.add_gpu_resource_option(group)
    group.add_argument("--once", action="store_true", help="run one cycle and exit")
    add(
        "--log-level",
        env="GPU_PROFILER_LOG_LEVEL",
        default="info",
        type=_log_level,
        metavar="LEVEL",
        help=", ".join(LOG_LEVELS),
    )
    parser.set_defaults(handler=handle)


def _fields(args: argparse.Namespace) -> list[str]:
    """The fields to read; by default in local mode without the MIG instances' DCGM profiling
    fields, which NVML does not sample (it reads MIG instances itself)."""
    chosen = options.fields(args)
    if args.prometheus_url or options.explicit_fields(args):
        return chosen
    return [name for name in chosen if name not in options.MIG_FIELDS]


@dataclass(frozen=True)
class RunConfig:
    """The effective configuration, validated."""

    node: str
    node_label: str
    prometheus_url: str | None
    fields: list[str]  # the classified one first
    step_seconds: float | None
    window_seconds: float
    interval_seconds: float
    sample_interval_seconds: float
    kubeconfig: str | None
    annotation_domain: str
    store_url: str | None  # None: no store
    retention_seconds: float | None  # raw rows; None: kept forever
    rollup_retention_seconds: float | None  # rollups and pods; None: kept forever
    store_interval_seconds: float  # 0: every cycle is written
    metrics_address: str
    metrics_port: int
    cgroup_root: Path
    once: bool
    prometheus_limits: options.PrometheusLimits
    protect_training: str = NO_PROTECTION  # PROTECT, NO_PROTECTION or RELEASE_PROTECTION
    gpu_resources: GpuResources = DEFAULT_GPU_RESOURCES  # with the renames --gpu-resource names

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunConfig:
        options.check_prometheus_url(args.prometheus_url)
        window = _required_duration(args.window, "--window")
        interval = _required_duration(args.interval, "--interval")
        sample_interval = _required_duration(args.sample_interval, "--sample-interval")
        names = _Names(
            options.named(args.window, "--window"),
            options.named(args.interval, "--interval"),
            options.named(args.sample_interval, "--sample-interval"),
        )
        _check_bounds(window, interval, sample_interval, local=not args.prometheus_url, names=names)
        step = options.duration(args.step, "--step")
        if step is not None and args.prometheus_url:
            from profiler_app.sources.prometheus import grid_ending_at  # noqa: PLC0415

            grid_ending_at(0.0, window, step)  # a step too fine for the window: said now, once
        store_url = _store_url(args.store_url)
        retention = _retention(args.retention, store_url, DEFAULT_RETENTION, "--retention")
        rollup_retention = _retention(
            args.rollup_retention, store_url, DEFAULT_ROLLUP_RETENTION, "--rollup-retention"
        )
        if retention and rollup_retention and rollup_retention < retention:
            raise UserError("--rollup-retention must not be shorter than --retention")
        domain = args.annotation_domain
        if kubernetes_configured(args.kubeconfig):
            domain = validate_domain(domain)
        return cls(
            node=args.node,
            node_label=args.node_label,
            prometheus_url=args.prometheus_url,
            fields=options.classified_first(_fields(args)),
            step_seconds=step,
            window_seconds=window,
            interval_seconds=interval,
            sample_interval_seconds=sample_interval,
            kubeconfig=args.kubeconfig,
            annotation_domain=domain,
            store_url=store_url,
            retention_seconds=retention,
            rollup_retention_seconds=rollup_retention,
            store_interval_seconds=_store_interval(
                args.store_interval, store_url, interval, window
            ),
            metrics_address=args.metrics_address,
            metrics_port=args.metrics_port,
            cgroup_root=Path(args.cgroup_root),
            once=args.once,
            prometheus_limits=options.prometheus_limits(args),
            protect_training=_protection_mode(args.protect_training),
            gpu_resources=options.gpu_resources(args),
        )

    def describe(self) -> str:
        """One log line, passwords masked."""
        source = (
            f"prometheus={without_credentials(self.prometheus_url)} node-label={self.node_label}"
            if self.prometheus_url
            else f"local sampling every {format_duration(self.sample_interval_seconds)}"
        )
        store = "none"
        if self.store_url is not None:
            from profiler_app.sinks.store.urls import parse_store_url  # noqa: PLC0415

            store = parse_store_url(self.store_url).display()
            for name, kept in (
                ("retention", self.retention_seconds),
                ("rollup-retention", self.rollup_retention_seconds),
            ):
                store += f" {name}={format_duration(kept) if kept else 'none'}"
            if self.store_interval_seconds:
                store += f" store-interval={format_duration(self.store_interval_seconds)}"
        metrics = (
            f"http://{self.metrics_address}:{self.metrics_port}/metrics"
            if self.metrics_port
            else "off"
        )
        return (
            f"node={self.node} {source} fields={','.join(self.fields)} "
            f"window={format_duration(self.window_seconds)} "
            f"interval={format_duration(self.interval_seconds)} "
            f"kubernetes={kubernetes_access(self.kubeconfig)} "
            f"annotation-domain={self.annotation_domain} store={store} metrics={metrics}"
            + (
                ""
                if self.protect_training == NO_PROTECTION
                else f" protect-training={self.protect_training}"
            )
            + "".join(f" gpu-resource={name}" for name in sorted(self.gpu_resources.declared))
            + (" once" if self.once else "")
        )


def kubernetes_configured(kubeconfig: str | None) -> bool:
    """Whether ``kube.connect`` will find credentials (checked without importing the client)."""
    return kubernetes_access(kubeconfig) != "off"


def kubernetes_access(kubeconfig: str | None) -> str:
    """What ``kube.connect`` will use, as the start-up line says it: the kubeconfig's path, the
    in-cluster service account, or off."""
    if kubeconfig:
        return kubeconfig
    return "in-cluster" if os.environ.get("KUBERNETES_SERVICE_HOST") else "off"


def _store_url(text: str | None) -> str | None:
    """The store URL, validated (one error line before anything starts); None for 'none'."""
    if text is not None and text.strip().lower() == "none":
        return None
    from profiler_app.sinks.store.urls import default_store_url, parse_store_url  # noqa: PLC0415

    url = text.strip() if text else default_store_url()
    options.checked(text or url, lambda _: parse_store_url(url))
    return url


def _protection_mode(value: str | None) -> str:
    """--protect-training's mode: the flag's value (``on`` alone), else the variable's."""
    if value is None:
        return NO_PROTECTION
    mode = PROTECTION_MODES.get(value.strip().lower())
    if mode is None:
        raise UserError(
            f"--protect-training / {PROTECT_TRAINING_ENV} {value!r}: use on (true), off (false) "
            "or release"
        )
    return mode


@dataclass(frozen=True)
class _Names:
    """How errors name the durations: their flags, or the environment variables they came from."""

    window: str
    interval: str
    sample_interval: str


def _check_bounds(
    window: float,
    interval: float,
    sample_interval: float,
    *,
    local: bool,
    names: _Names = _Names("--window", "--interval", "--sample-interval"),
) -> None:
    floor = MIN_SAMPLE_INTERVAL_SECONDS if local else MIN_PROMETHEUS_INTERVAL_SECONDS
    if interval < floor:
        reading = "sampling locally" if local else "reading Prometheus"
        raise UserError(f"{names.interval} must be at least {floor:g}s when {reading}")
    if interval > MAX_INTERVAL_SECONDS:
        raise UserError(f"{names.interval} must be at most 1d")
    if sample_interval < MIN_SAMPLE_INTERVAL_SECONDS:
        raise UserError(
            f"{names.sample_interval} must be at least {MIN_SAMPLE_INTERVAL_SECONDS:g}s"
        )
    if sample_interval > window:
        raise UserError(f"{names.sample_interval} must not be longer than {names.window}")
    if local and window / sample_interval > MAX_LOCAL_SAMPLES:
        raise UserError(
            f"{names.window} {format_duration(window)} at {names.sample_interval} "
            f"{format_duration(sample_interval)} is more than the {MAX_LOCAL_SAMPLES:,} samples "
            f"local sampling keeps: use --sample-interval "
            f"{math.ceil(window / MAX_LOCAL_SAMPLES)}s or a shorter --window"
        )


def _retention(text: str | None, store_url: str | None, default: str, flag: str) -> float | None:
    """Seconds rows stay in the store; None to keep them."""
    if store_url is None or (text is not None and text.strip().lower() == "none"):
        return None
    return _required_duration(text or default, flag)


def _store_interval(
    text: str | None, store_url: str | None, interval: float, window: float
) -> float:
    """Seconds between store writes; 0 when every cycle is written."""
    if store_url is None:
        return 0.0
    if text is None:
        from profiler_app.sinks.store.urls import parse_store_url  # noqa: PLC0415

        if parse_store_url(store_url).sqlite_path() is not None:
            return 0.0
        seconds = min(max(DEFAULT_POSTGRESQL_STORE_INTERVAL, interval), window)
    else:
        seconds = _required_duration(text, "--store-interval")
        if seconds < interval or seconds > window:
            raise UserError("--store-interval must be between --interval and --window")
    return 0.0 if seconds == interval else seconds


def _required_duration(text: str, flag: str) -> float:
    seconds = options.duration(text, flag)
    if seconds is None:  # options with a default are never None
        raise UserError(f"{flag} is required")
    return seconds


def handle(args: argparse.Namespace) -> int:
    config = RunConfig.from_args(args)
    log.info("gpu-profiler run: %s", config.describe())
    with contextlib.ExitStack() as resources:
        daemon = _build(config, resources)
        _stop_on_signals(daemon)
        # Local samples start now: give them one interval (at most the window) to accumulate.
        first_delay = (
            0.0 if config.prometheus_url else min(config.interval_seconds, config.window_seconds)
        )
        try:
            return daemon.run(once=config.once, first_delay_seconds=first_delay)
        finally:
            if not daemon.close():
                resources.pop_all()  # a cycle still runs: close nothing under it


def _build(config: RunConfig, resources: contextlib.ExitStack) -> Daemon:
    """Starts every part. The daemon's ``close`` stops the sources, then closes the sinks;
    ``resources`` (closed in reverse) holds what both use, and anything started before a
    failure."""
    from profiler_app.daemon import Daemon  # noqa: PLC0415
    from profiler_app.sinks.metrics import Heartbeat, MetricsSink  # noqa: PLC0415
    from profiler_app.sources.cadvisor import PodIoQuery, PodPeaksQuery  # noqa: PLC0415
    from profiler_app.sources.prometheus import PrometheusSource  # noqa: PLC0415

    sources = resources.enter_context(contextlib.ExitStack())
    host: HostSampler | None = None
    notice = None
    source: MetricsSource
    metric_pod_peaks = metric_pod_io = None
    if config.prometheus_url:
        prometheus = PrometheusSource(
            config.prometheus_url,
            config.node,
            config.node_label,
            config.fields,
            config.step_seconds,
            timeout=PROMETHEUS_TIMEOUT_SECONDS,
            optional_fields=config.fields[1:],
            **config.prometheus_limits,
        )
        sources.callback(prometheus.close)
        source = prometheus
        metric_pod_peaks = PodPeaksQuery(prometheus).read
        metric_pod_io = PodIoQuery(prometheus).read
    else:
        from profiler_app.sources.host import HostSampler  # noqa: PLC0415
        from profiler_app.sources.nvml import NvmlSource  # noqa: PLC0415

        # Host and pod-cgroup sampling feed only local mode: in the DaemonSet's Prometheus mode
        # the container cannot see the host's cgroups, and cAdvisor gives the pod peaks.
        host = HostSampler(
            config.sample_interval_seconds, config.window_seconds, cgroup_root=config.cgroup_root
        )
        host.start()
        sources.callback(host.close)
        nvml = NvmlSource(
            config.node,
            config.window_seconds,
            config.sample_interval_seconds,
            fields=config.fields,
        )
        nvml.start()
        sources.callback(nvml.close)
        notice = nvml.unavailable_reason
        source = nvml

    sinks: list[Sink] = []
    watcher, node_sharing = _start_kubernetes(config, resources, sources, sinks)
    if config.store_url is not None:
        from profiler_app.sinks.store import TableStore  # noqa: PLC0415

        sinks.append(
            TableStore(
                config.store_url,
                retention_seconds=config.retention_seconds,
                rollup_retention_seconds=config.rollup_retention_seconds,
                store_interval_seconds=config.store_interval_seconds,
                migrate_in_child=True,  # Alembic stays out of the daemon's memory
            )
        )
    embedded = config.prometheus_url is None and watcher is None
    if embedded or sys.stdout.isatty():
        from profiler_app.sinks.terminal import TerminalSink  # noqa: PLC0415

        sinks.append(TerminalSink(notice=notice))
    metrics = MetricsSink(
        Heartbeat(max(STALE_INTERVALS * config.interval_seconds, 60.0)),
    )
    if config.metrics_port:
        metrics.serve(config.metrics_address, config.metrics_port)
    sinks.append(metrics)
    return Daemon(
        node=config.node,
        source=source,
        sinks=sinks,
        metrics=metrics,
        window_seconds=config.window_seconds,
        interval_seconds=config.interval_seconds,
        primary_field=config.fields[0],
        node_label=config.node_label,
        host=host,
        pods=watcher.listed if watcher is not None else None,
        metric_pod_peaks=metric_pod_peaks,
        node_sharing=node_sharing,
        metric_pod_io=metric_pod_io,
        sources=sources.pop_all(),
    )


def _start_kubernetes(
    config: RunConfig,
    resources: contextlib.ExitStack,
    sources: contextlib.ExitStack,
    sinks: list[Sink],
) -> tuple[PodWatcher | None, NodeSharing | None]:
    """Starts the pod watcher and adds the annotation sink, and reads the node's GPU sharing
    labels; (None, None) when Kubernetes is off."""
    if not kubernetes_configured(config.kubeconfig):
        return None, None
    from profiler_app.core import kube  # noqa: PLC0415
    from profiler_app.sinks.kubernetes import KubernetesSink, protection  # noqa: PLC0415
    from profiler_app.sources.gfd import NodeSharing  # noqa: PLC0415
    from profiler_app.sources.kube_pods import PodWatcher  # noqa: PLC0415

    connection = kube.connect(config.kubeconfig)
    if connection is None:
        return None, None
    resources.callback(connection.close)
    protecting = config.protect_training != NO_PROTECTION
    keys = protection.watched_annotations(config.annotation_domain) if protecting else ()
    watcher = PodWatcher(connection, config.node, annotation_keys=keys, gpus=config.gpu_resources)
    watcher.start()
    sources.callback(watcher.stop, 1.0)
    if not watcher.wait_until_synced(POD_SYNC_TIMEOUT_SECONDS):
        log.warning(
            "no pod list from Kubernetes after %gs: until it comes, pods are not annotated, "
            "protected or stored",
            POD_SYNC_TIMEOUT_SECONDS,
        )
    if protecting:  # before the usage annotations: it matters more
        sinks.append(
            protection.TrainingProtector(
                connection,
                config.node,
                domain=config.annotation_domain,
                release_only=config.protect_training == RELEASE_PROTECTION,
                interval_seconds=config.interval_seconds,
            )
        )
    sinks.append(KubernetesSink(connection, config.node, domain=config.annotation_domain))
    return watcher, NodeSharing(connection, config.node)


def _stop_on_signals(daemon: Daemon) -> None:
    def request_stop(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        daemon.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)
