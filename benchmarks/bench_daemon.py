"""Cost of ``gpu-profiler run`` on one node: peak RSS, CPU, requests per cycle.

Run by hand from the repository root: ``.venv/bin/python benchmarks/bench_daemon.py``
(``--duration 600 --interval 30`` by default). Starts a real Prometheus holding the standard
dcgm-exporter dataset (3 nodes x 4 GPUs, 6 h at 10 s), the stand-in Kubernetes API server (a
test double: see tests/support/apiserver/) with the node and its GPU pods, and the daemon as a
subprocess profiling gpu-node-1 into a SQLite store. Samples the daemon's RSS and CPU time every
second and counts requests server side: Prometheus' own ``prometheus_http_requests_total`` and
the API server's request log.

Memory depends on what the interpreter can import: in the dev ``.venv`` the Kubernetes client
finds the optional ``kubernetes_validate`` (with jsonschema, about 2.8 MiB) that the image lacks.
For the image's figure, run it from a virtual environment with only the image's packages and
the image's environment: ``python3.11 -m venv /tmp/image && /tmp/image/bin/pip install
--require-hashes --no-deps -r constraints/image.txt && /tmp/image/bin/pip install --no-deps
--no-build-isolation . && /tmp/image/bin/pip install pytest``, then ``OPENBLAS_NUM_THREADS=1
/tmp/image/bin/python benchmarks/bench_daemon.py`` (pytest only for the harness).

``--outage SECONDS`` starts the daemon with the API server answering every request 503 for that
long, then lists every request it received meanwhile next to the back-off schedule
(profiler_app.core.backoff: one interval doubling to ten for the sink, 1 s doubling to 60 s for the
pod watcher): during an outage there must be no request beyond it.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler_app.commands.options import DEFAULT_FIELDS  # noqa: E402
from profiler_app.core.backoff import MAX_BACKOFF_INTERVALS  # noqa: E402
from tests.support.apiserver.objects import pod_manifest  # noqa: E402
from tests.support.apiserver.server import StandInApiServer, running_apiserver  # noqa: E402
from tests.support.apiserver.state import RecordedRequest  # noqa: E402
from tests.support.dcgm import Dataset, standard_dataset  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.prometheus import PrometheusServer  # noqa: E402

NODE = "gpu-node-1"
FIELDS = len(DEFAULT_FIELDS)  # the daemon's default fields


def cycle_count(metrics_url: str) -> int:
    try:
        text = requests.get(metrics_url, timeout=2).text
    except requests.RequestException:
        return 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpu_profiler_cycle_duration_seconds_count":
                return round(sample.value)
    return 0


def changed_annotation_keys(recorded: list[RecordedRequest]) -> dict[str, int]:
    """How often each annotation (by key suffix, e.g. gpu-0-fb-used-max-mib) was patched."""
    counts: dict[str, int] = {}
    for request in recorded:
        if request.method != "PATCH":
            continue
        for key in request.json().get("metadata", {}).get("annotations", {}):
            suffix = key.rpartition("/")[2]
            counts[suffix] = counts.get(suffix, 0) + 1
    return dict(sorted(counts.items()))


def measure_embedded(duration: float, interval: float) -> None:
    """RSS and CPU of ``gpu-profiler run`` on its defaults (this machine has no GPU)."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPU_PROFILER_")}
    environment.pop("KUBECONFIG", None)
    environment["XDG_DATA_HOME"] = str(workdir)
    command = [
        sys.executable, "-m", "profiler_app", "run", "--interval", f"{interval}s",
        "--metrics-port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    with (workdir / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log, stderr=log)
        process = psutil.Process(daemon.pid)
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        while cycle_count(metrics_url) < 1:
            time.sleep(0.5)
        first_cpu, first_at = process.cpu_times(), time.monotonic()
        peak_rss = process.memory_info().rss
        while time.monotonic() - first_at < duration:
            time.sleep(1.0)
            peak_rss = max(peak_rss, process.memory_info().rss)
        cpu, elapsed = process.cpu_times(), time.monotonic() - first_at
        cycles = cycle_count(metrics_url)
        daemon.send_signal(signal.SIGTERM)
        status = daemon.wait(timeout=30)
    busy = (cpu.user + cpu.system) - (first_cpu.user + first_cpu.system)
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}")
    print(f"embedded default, interval {interval:g}s, sampling every 1s, {elapsed:.0f}s measured")
    print(f"cycles: {cycles}, peak RSS: {peak_rss / 2**20:.1f} MiB")
    print(f"CPU: {busy:.2f}s over {elapsed:.0f}s = {100 * busy / elapsed:.2f}% of one core")
    print(f"SIGTERM: exit {status}")


def api_requests(prometheus: PrometheusServer) -> int:
    """Range queries (one per field) plus instant queries (the pods' CPU and memory peaks)."""
    return prometheus.requests_served() + prometheus.requests_served("/api/v1/query")


def schedule(start: float, initial: float, maximum: float, until: float) -> list[float]:
    """When the back-off policy tries again after failures from ``start`` on (seconds)."""
    tries, delay, at = [], initial, start
    while at < until:
        tries.append(at)
        at += delay
        delay = min(2 * delay, maximum)
    return tries


def add_node_and_pods(apiserver: StandInApiServer, dataset: Dataset, *, failing: bool) -> None:
    """The node and its GPU pods; ``failing``: 503 for every call the daemon makes (node GET
    and PATCH, the pod list and watch, pod GET and PATCH) until ``clear_faults``."""
    apiserver.add_node(NODE)
    paths = [f"/api/v1/nodes/{NODE}", "/api/v1/pods"]
    for gpu in dataset.gpus:
        if gpu.hostname == NODE and gpu.pod:
            apiserver.add_pod(pod_manifest("ml", gpu.pod, NODE, gpus=1))
            paths.append(f"/api/v1/namespaces/ml/pods/{gpu.pod}")
    for path in paths if failing else []:
        for method in ("GET", "PATCH"):
            apiserver.fail(method, path, 503)


def report_outage(
    apiserver: StandInApiServer, started: float, outage: float, interval: float
) -> None:
    """Requests the API server got during the outage, against the schedule."""
    during = [r for r in apiserver.requests() if r.received_at - started < outage]
    sink = [r.received_at - started for r in during if r.path != "/api/v1/pods"]
    watcher = [r.received_at - started for r in during if r.path == "/api/v1/pods"]
    first = sink[0] if sink else 0.0
    # Cycles start about one interval apart, a little more each (the cycle's own time).
    sink_schedule = schedule(first, interval, MAX_BACKOFF_INTERVALS * interval, outage)
    watcher_schedule = schedule(watcher[0] if watcher else 0.0, 1.0, 60.0, outage)
    print(f"API outage: every request answered 503 for {outage:g}s from the daemon's start")
    print(f"sink requests: {len(sink)} at {[round(t) for t in sink]} s")
    print(f"  back-off schedule (no drift): {len(sink_schedule)} tries at "
          f"{[round(t) for t in sink_schedule]} s")  # fmt: skip
    print(f"pod watcher requests: {len(watcher)} at {[round(t) for t in watcher]} s")
    print(f"  back-off schedule (no drift): {len(watcher_schedule)} tries at "
          f"{[round(t) for t in watcher_schedule]} s")  # fmt: skip


def parse_options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="measure the embedded default instead (local sampling, SQLite, no Kubernetes)",
    )
    parser.add_argument(
        "--store-url",
        default=None,
        help="DaemonSet mode's store (default: SQLite in a temp dir; 'none': no store)",
    )
    parser.add_argument(
        "--outage",
        type=float,
        default=0.0,
        help="seconds the API server fails every request from the start (default 0: none)",
    )
    parser.add_argument(
        "--protect-training",
        action="store_true",
        help="run the daemon with --protect-training (do-not-disrupt on training pods)",
    )
    return parser.parse_args()


def main() -> None:
    options = parse_options()
    if options.embedded:
        measure_embedded(options.duration, options.interval)
        return

    # Data runs on past the end of the measurement, as a live dcgm-exporter's would.
    dataset = standard_dataset(end=time.time() + options.duration + 300)
    workdir = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
    with PrometheusServer(dataset.openmetrics) as prometheus, running_apiserver() as apiserver:
        add_node_and_pods(apiserver, dataset, failing=bool(options.outage))
        kubeconfig = apiserver.write_kubeconfig(workdir / "kubeconfig")
        port = free_port()
        environment = {k: v for k, v in os.environ.items() if not k.startswith("GPU_PROFILER_")}
        command = [
            sys.executable, "-m", "profiler_app", "run",
            "--prometheus-url", prometheus.url, "--node", NODE,
            "--kubeconfig", str(kubeconfig),
            "--store-url", options.store_url or f"sqlite:///{workdir / 'profiler.db'}",
            "--metrics-port", str(port), "--interval", f"{options.interval}s",
            "--log-level", "warning",
            *(["--protect-training"] if options.protect_training else []),
        ]  # fmt: skip
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        log = (workdir / "daemon.log").open("wb")
        daemon = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log, stderr=log)
        process = psutil.Process(daemon.pid)
        started = time.monotonic()
        outage_started = time.time()
        while cycle_count(metrics_url) < 1 and time.monotonic() - started < 60:
            time.sleep(0.2)
        startup_seconds = time.monotonic() - started
        first_cpu = process.cpu_times()
        first_at = time.monotonic()
        prometheus_first = api_requests(prometheus)
        first_cycle = [
            f"{r.method} {'pod' if '/pods/' in r.path else 'node'}"
            for r in apiserver.requests()
            if "watch" not in r.query and r.path != "/api/v1/pods"
        ]
        kube_first = len(apiserver.requests())
        kube_writes_first = len(apiserver.requests("PATCH"))
        cycles_first = cycle_count(metrics_url)
        peak_rss = first_rss = process.memory_info().rss
        while time.monotonic() - first_at < options.duration:
            time.sleep(1.0)
            peak_rss = max(peak_rss, process.memory_info().rss)
            if options.outage and time.time() - outage_started >= options.outage:
                apiserver.clear_faults()
        cpu = process.cpu_times()
        elapsed = time.monotonic() - first_at
        cycles = cycle_count(metrics_url) - cycles_first
        prometheus_requests = api_requests(prometheus) - prometheus_first
        all_kube = apiserver.requests()[kube_first:]
        kube_writes = len(apiserver.requests("PATCH")) - kube_writes_first
        daemon.send_signal(signal.SIGTERM)
        stop_started = time.monotonic()
        status = daemon.wait(timeout=30)
        stop_seconds = time.monotonic() - stop_started
        log.close()

    report(
        options.interval,
        elapsed=elapsed,
        startup_seconds=startup_seconds,
        cycles=cycles,
        rss=(first_rss, peak_rss),
        busy=(cpu.user + cpu.system) - (first_cpu.user + first_cpu.system),
        prometheus_requests=prometheus_requests,
        kube_requests=[(r.method, "watch" in r.query) for r in all_kube],
        changed_keys=changed_annotation_keys(all_kube),
        kube_writes=kube_writes,
        first_cycle=first_cycle,
        stop=(status, stop_seconds),
    )
    if options.outage:
        report_outage(apiserver, outage_started, options.outage, options.interval)


def report(
    interval: float,
    *,
    elapsed: float,
    startup_seconds: float,
    cycles: int,
    rss: tuple[int, int],
    busy: float,
    prometheus_requests: int,
    kube_requests: list[tuple[str, bool]],
    kube_writes: int,
    changed_keys: dict[str, int],
    first_cycle: list[str] | None = None,
    stop: tuple[int, float],
) -> None:
    watch_requests = sum(1 for method, watch in kube_requests if method == "GET" and watch)
    other_kube = len(kube_requests) - watch_requests
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}")
    print(f"interval {interval:g}s, measured {elapsed:.0f}s after the first cycle")
    print(f"startup to first cycle: {startup_seconds:.1f}s")
    print(f"cycles: {cycles}")
    print(f"RSS after the first cycle: {rss[0] / 2**20:.1f} MiB, peak: {rss[1] / 2**20:.1f} MiB")
    print(f"CPU: {busy:.2f}s over {elapsed:.0f}s = {100 * busy / elapsed:.2f}% of one core")
    print(f"Prometheus requests per cycle: {prometheus_requests / max(cycles, 1):.2f}")
    print(
        f"Kubernetes requests per cycle, excluding pod watches: {other_kube / max(cycles, 1):.2f}"
    )
    print(f"Kubernetes PATCH requests after the first cycle: {kube_writes}")
    if first_cycle is not None:
        counts = {call: first_cycle.count(call) for call in sorted(set(first_cycle))}
        print(f"Kubernetes requests up to the first cycle (besides pod lists): {counts}")
    print(f"annotations those PATCHes changed (key suffix: count): {changed_keys}")
    print(f"pod watch (re)connections: {watch_requests} (one per watch timeout, 30 s)")
    print(f"SIGTERM: exit {stop[0]} after {stop[1]:.2f}s")


if __name__ == "__main__":
    main()
