"""The profiler's ServiceMonitor endpoint, scraped by a real Prometheus from a hostile target.

A stub target serves what a compromised profiler could: a dcgm-exporter series for another node,
and profiler series that claim another node, job and instance. Prometheus scrapes it with the
scrape configuration the Prometheus Operator makes of the endpoint
(prometheus-operator/prometheus-operator, pkg/prometheus/promcfg.go,
``generateServiceMonitorConfig``: ``honorLabels`` to ``honor_labels``, the operator's own target
labels ``namespace``, ``service``, ``pod``, ``container``, ``endpoint`` and ``job``, then the
endpoint's ``relabelings`` as ``relabel_configs`` and ``metricRelabelings`` as
``metric_relabel_configs``). Prometheus itself (prometheus/prometheus, scrape/scrape.go,
``mutateSampleLabels``): with ``honor_labels: false`` each target label replaces the series' own,
whose value moves to ``exported_<name>``; ``metric_relabel_configs`` then run on the result.
Kubernetes service discovery's ``__meta_kubernetes_pod_node_name``
comes here as a static target label (labels starting ``__`` are dropped after relabelling, as
discovery's are).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
import yaml

from infra.profiler import METRIC_RELABELINGS, SCRAPE_RELABELINGS
from infra.render.program import ProgramRun
from tests.support.prometheus import PrometheusServer

REAL_NODE, OTHER_NODE = "ip-10-0-1-17.ec2.internal", "ip-10-0-2-42.ec2.internal"
HOSTILE = f"""\
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{Hostname="{OTHER_NODE}",gpu="0",namespace="ml",pod="bert-0"}} 0
# TYPE gpu_profiler_gpu_job_type gauge
gpu_profiler_gpu_job_type{{Hostname="{OTHER_NODE}",gpu="0",job_type="idle",namespace="ml",\
pod="bert-0",job="dcgm-exporter",instance="10.9.9.9:9400",service="dcgm-exporter",\
endpoint="metrics",exported_namespace="kube-system"}} 1
# TYPE gpu_profiler_pod_gpus gauge
gpu_profiler_pod_gpus{{node="{OTHER_NODE}",namespace="ml",pod="bert-0"}} 1
# TYPE up_forged gauge
up_forged 1
"""


class _Target(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = HOSTILE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _prometheus_relabel(rule: dict[str, Any]) -> dict[str, Any]:
    return {_snake(key): value for key, value in rule.items()}


@pytest.fixture
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def scrape_config(endpoint: dict[str, Any], address: str) -> str:
    job = {
        "job_name": "serviceMonitor/gpu-profiler/gpu-profiler/0",
        "scrape_interval": "1s",
        "honor_labels": endpoint["honorLabels"],
        "static_configs": [
            {
                "targets": [address],
                "labels": {
                    "__meta_kubernetes_pod_node_name": REAL_NODE,
                    "namespace": "gpu-profiler",
                    "service": "gpu-profiler",
                    "pod": "gpu-profiler-x7k2p",
                    "container": "gpu-profiler",
                    "endpoint": "metrics",
                    "job": "gpu-profiler",
                },
            }
        ],
        "relabel_configs": [_prometheus_relabel(r) for r in endpoint["relabelings"]],
        "metric_relabel_configs": [_prometheus_relabel(r) for r in endpoint["metricRelabelings"]],
    }
    return yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]})


def _series(url: str) -> list[dict[str, str]]:
    answer = requests.get(f"{url}/api/v1/series", params={"match[]": '{__name__=~".+"}'}, timeout=5)
    answer.raise_for_status()
    found: list[dict[str, str]] = answer.json()["data"]
    return [s for s in found if not s["__name__"].startswith(("up", "scrape_"))]


def test_the_service_monitor_is_the_modules_endpoint(eks_run: ProgramRun) -> None:
    monitor = eks_run.one("kubernetes:monitoring.coreos.com/v1:ServiceMonitor").inputs
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is False
    assert endpoint["relabelings"] == SCRAPE_RELABELINGS
    assert endpoint["metricRelabelings"] == METRIC_RELABELINGS


def test_a_hostile_profiler_speaks_only_for_its_own_node(target: str) -> None:
    endpoint = {
        "honorLabels": False,
        "relabelings": SCRAPE_RELABELINGS,
        "metricRelabelings": METRIC_RELABELINGS,
    }
    with PrometheusServer() as prometheus:
        prometheus.stop()
        prometheus.config.write_text(scrape_config(endpoint, target))
        prometheus.start()
        deadline = time.monotonic() + 20
        series: list[dict[str, str]] = []
        while time.monotonic() < deadline and len(series) < 2:
            time.sleep(0.5)
            series = _series(prometheus.url)
    by_name = {s["__name__"]: s for s in series}
    assert sorted(by_name) == ["gpu_profiler_gpu_job_type", "gpu_profiler_pod_gpus"]
    job_type = by_name["gpu_profiler_gpu_job_type"]
    assert job_type["Hostname"] == job_type["node"] == REAL_NODE
    assert job_type["job"] == "gpu-profiler"
    assert (job_type["service"], job_type["endpoint"]) == ("gpu-profiler", "metrics")
    assert job_type["instance"] == target
    # the workload's namespace and pod, not the profiler pod's
    assert (job_type["namespace"], job_type["pod"]) == ("ml", "bert-0")
    assert not [key for s in series for key in s if key.startswith("exported_")]
    assert by_name["gpu_profiler_pod_gpus"]["node"] == REAL_NODE
