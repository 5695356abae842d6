"""The in-cluster services behind the stand-in GPU cluster's service proxy and metrics APIs.

- ``StandInDcgmExporter``: TEST DOUBLE for dcgm-exporter. Serves, in Prometheus' text format, every
  field of infra/monitoring/dcgm-counters.csv for the GPUs of the nodes where its DaemonSet pod
  runs, with dcgm-exporter's labels (``tests.support.dcgm.Gpu``), attributed to the pod the
  stand-in device plugin gave the GPU to; a training pod's GPUs show its step period as a
  waveform (``values``). A real Prometheus scrapes it.
- ``StandInGrafana``: TEST DOUBLE for Grafana's ``GET /api/health`` and ``POST /login`` (JSON
  ``{"user", "password"}``; 200 ``{"message": "Logged in"}`` or 401, as Grafana answers).
- ``prometheus_config``: a real Prometheus that scrapes the stand-in exporter every second and
  evaluates the GPU platform's own rules (infra/monitoring/rules.yaml) every second.
- ``custom_metric_values``: prometheus-adapter's custom-metrics rules
  (infra/monitoring/adapter-rules.yaml) evaluated against that Prometheus, the way the adapter
  fills their ``metricsQuery`` templates.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests
import yaml

from infra import monitoring
from infra.platform import DCGM_EXPORTER_RELEASE
from tests.support.dcgm import Gpu

Json = dict[str, Any]
# (status, content type, body) for (method, path, query, body)
Answer = tuple[int, str, bytes]
Responder = Callable[[str, str, dict[str, str], bytes], Answer]
RULES_FILE = "gpu-rules.yaml"
JSON = "application/json"


class HttpStub:
    """A small HTTP/1.1 server on 127.0.0.1 that answers with ``responder``."""

    def __init__(self, responder: Responder) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                query = dict(parse_qsl(split.query))
                status, content_type, data = responder(self.command, split.path, query, body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer  # noqa: N815  the http.server hook names

            def log_message(self, format: str, *args: object) -> None:
                """Silent."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _counter_types() -> dict[str, str]:
    """DCGM field -> Prometheus type, from the counters CSV the platform ships."""
    types = {}
    for line in monitoring.dcgm_counters_csv().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            field, kind = (part.strip() for part in line.split(",")[:2])
            types[field] = kind
    return types


# Values of a healthy, idle GPU; a GPU held by a pod is busy (utilisation, memory).
IDLE_VALUES = {"DCGM_FI_DEV_GPU_TEMP": 38.0, "DCGM_FI_DEV_POWER_USAGE": 61.5}
BUSY_VALUES = {
    "DCGM_FI_DEV_GPU_UTIL": 87.0,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
    "DCGM_FI_DEV_FB_USED": 17_000.0,
}
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"

GpuSource = Callable[[], list[tuple[Gpu, bool]]]  # every reported GPU; True: failed row remap
GpuValues = Callable[[Gpu], dict[str, float]]  # a GPU's fields where they differ from the above


class StandInDcgmExporter(HttpStub):
    """dcgm-exporter's /metrics for what ``source`` says is there (see the module docstring), with
    ``values`` (the trials' waveforms) where given; ``more`` adds lines of other exporters the
    same Prometheus job stands in for (the profiler's store errors)."""

    def __init__(
        self,
        source: GpuSource,
        values: GpuValues | None = None,
        more: Callable[[], list[str]] | None = None,
    ) -> None:
        self._types = _counter_types()
        self._source = source
        self._values = values
        self._more = more or list
        super().__init__(self._respond)

    def _respond(self, method: str, path: str, query: dict[str, str], body: bytes) -> Answer:
        if (method, path) != ("GET", "/metrics"):
            return 404, "text/plain", b"404 page not found\n"
        return 200, "text/plain; version=0.0.4", self.text().encode()

    def text(self) -> str:
        gpus = self._source()
        overrides = {device: self._values(device) if self._values else {} for device, _ in gpus}
        lines = []
        for field, kind in self._types.items():
            if not gpus:
                continue
            lines += [f"# HELP {field} {field}", f"# TYPE {field} {kind}"]
            for device, failed_remap in gpus:
                value = IDLE_VALUES.get(field, 0.0)
                if device.pod is not None:
                    value = BUSY_VALUES.get(field, value)
                if field == ROW_REMAP_FAILURE and failed_remap:
                    value = 1.0
                value = overrides[device].get(field, value)
                labels = ",".join(f'{key}="{text}"' for key, text in device.labels().items())
                lines.append(f"{field}{{{labels}}} {value:g}")
        return "\n".join([*lines, *self._more()]) + "\n"


class StandInGrafana(HttpStub):
    """Grafana's health and login endpoints, with one admin user (see the module docstring)."""

    def __init__(self, admin_password: str, admin_user: str = "admin") -> None:
        self._credentials = (admin_user, admin_password)
        super().__init__(self._respond)

    def _respond(self, method: str, path: str, query: dict[str, str], body: bytes) -> Answer:
        if (method, path) == ("GET", "/api/health"):
            return 200, JSON, b'{"database": "ok", "version": "12.1.1"}'
        if (method, path) == ("POST", "/login"):
            try:
                form = json.loads(body)
                given = (form["user"], form["password"])
            except (ValueError, KeyError, TypeError):
                return 400, JSON, b'{"message": "bad request data"}'
            if given == self._credentials:
                return 200, JSON, b'{"message": "Logged in"}'
            return 401, JSON, b'{"message": "Invalid username or password"}'
        return 404, JSON, b'{"message": "Not found"}'


def prometheus_config(exporter_url: str) -> str:
    """A Prometheus configuration: scrape the exporter as job dcgm-exporter, keep its pod labels
    (the ServiceMonitor's honorLabels), evaluate the GPU rules, all every second."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [RULES_FILE],
        "scrape_configs": [
            {
                "job_name": DCGM_EXPORTER_RELEASE,
                "honor_labels": True,
                "static_configs": [{"targets": [urlsplit(exporter_url).netloc]}],
            }
        ],
    }
    return yaml.safe_dump(config)


def rules_file() -> str:
    """The PrometheusRule's spec is also a Prometheus rule file."""
    return yaml.safe_dump(monitoring.prometheus_rules())


def _adapter_rule(metric: str) -> Json | None:
    """The adapter's custom rule that serves ``metric`` for pods."""
    for rule in monitoring.adapter_rules()["custom"]:
        targets = {target.get("resource") for target in rule["resources"]["overrides"].values()}
        if rule["name"]["as"] == metric and "pod" in targets:
            return dict(rule)
    return None


def custom_metric_values(
    prometheus_url: str, metric: str, namespace: str, pods: list[str]
) -> dict[str, float] | None:
    """``metric`` for ``pods`` of ``namespace`` as prometheus-adapter computes it; None when no
    rule defines the metric."""
    rule = _adapter_rule(metric)
    if rule is None or not pods:
        return None if rule is None else {}
    series = rule["name"]["matches"].strip("^$")
    overrides = rule["resources"]["overrides"]
    label_of = {target["resource"]: label for label, target in overrides.items()}
    matchers = f'{label_of["namespace"]}="{namespace}",{label_of["pod"]}=~"{"|".join(pods)}"'
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", label_of["pod"])
    )
    answer = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=10)
    answer.raise_for_status()
    return {
        sample["metric"][label_of["pod"]]: float(sample["value"][1])
        for sample in answer.json()["data"]["result"]
    }
