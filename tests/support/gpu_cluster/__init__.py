"""A stand-in GPU cluster for the smoke suite: a TEST DOUBLE of a cluster after `pulumi up`.

No API server, kubelet or GPU can run here. ``running_gpu_cluster(scenario)`` starts, on
127.0.0.1:

- the stand-in API server of tests/support/apiserver/, extended (``StandInGpuCluster``, a
  subclass; the base module is unchanged) with what a GPU cluster serves: Node and Service lists,
  namespaces, DaemonSets with their status, pods by label selector, creating and deleting pods
  and reading their logs, the ``v1beta1.custom.metrics.k8s.io`` APIService and its metrics, and
  the service proxy (``/api/v1/namespaces/NS/services/NAME:PORT/proxy/...``);
- behind that proxy, a REAL Prometheus (tests/support/prometheus.py) that scrapes a stand-in
  dcgm-exporter every second and evaluates the platform's real GPU rules, and a stand-in Grafana
  (backends.py).

What it models, and how (``Scenario`` says what differs from a healthy cluster):

- Controllers, once at start: each DaemonSet of the GPU layer (names from the smoke suite's
  layout, itself from infra/) gets a pod on every node whose labels and taints admit it, with
  infra/gpu.py's nodeSelector and tolerations; Prometheus, Grafana, the operator and the adapter
  get one pod on the first node that admits them (they tolerate no taint), or stay Pending with
  the scheduler's message. ``Scenario.unready`` leaves a pod waiting with a reason.
- Node state follows from where pods are ready: ``nvidia.com/gpu`` capacity and allocatable where
  the device plugin runs, the profiler's annotations where the profiler runs, DCGM series where
  dcgm-exporter runs; a Service answers only when a ready pod backs it.
- Test pods: the scheduler binds a pod at creation (or when a node joins) to the first node (by
  name) that its nodeSelector, tolerations and free GPUs allow, and allocates GPUs like the
  device plugin; else it stays Pending with a FailedScheduling-style message. No container
  runs: the kubelet model (objects.run_container) prints what ``nvidia-smi -L`` would for the
  GPUs the pod can see, and keeps a ``sleep`` running until the pod is deleted; other commands
  are refused (422).
- Jobs, Kubeflow PyTorchJobs, ConfigMaps, ResourceQuotas and PriorityClasses with their
  controllers, admission and garbage collection by owner references (batch.py), on the cluster's
  clock (a test may fake it); GPU feature discovery's labels where the device plugin runs;
  training containers whose step period follows their placement (scenario.TrainingModel), as
  log lines and as the GPU utilisation waveform the stand-in dcgm-exporter serves.
- Karpenter, where the scenario has one (karpenter.py, a test double of its own): NodeClaims
  for unschedulable GPU pods, nodes that join and later go away when empty.
- Names are taken from the same source the smoke suite uses, so a wrong name is not caught here.

Not modelled: TLS, RBAC, watches of the new kinds, controllers reacting to later changes
(but nodes that Karpenter adds), rescheduling, images, resource requests other than GPUs.
Scheduling honours nodeSelector, taints, required node affinity, required pod affinity and
topology spread (DoNotSchedule) on the hostname, and free GPUs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import requests

from tests.support.gpu_cluster.apiserver import StandInGpuCluster
from tests.support.gpu_cluster.backends import RULES_FILE, prometheus_config, rules_file
from tests.support.gpu_cluster.scenario import (
    GpuNode,
    Karpenter,
    Keda,
    Scenario,
    Storage,
    StoreDatabase,
    Taint,
    TrainingModel,
    Unready,
)
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer

__all__ = [
    "GpuNode",
    "Karpenter",
    "Keda",
    "Scenario",
    "StandInGpuCluster",
    "Storage",
    "StoreDatabase",
    "Taint",
    "TrainingModel",
    "Unready",
    "running_gpu_cluster",
]
SETTLE_TIMEOUT_SECONDS = 30.0
PORT_ATTEMPTS = 3


def _api(prometheus_url: str, path: str, query: dict[str, str]) -> Any:
    answer = requests.get(f"{prometheus_url}/api/v1/{path}", params=query, timeout=5)
    return answer.json()["data"]


def _first_scrape(prometheus_url: str) -> float | None:
    """When Prometheus stored the exporter's scrape that it holds now, if it holds one."""
    result = _api(prometheus_url, "query", {"query": "timestamp(up == 1)"})["result"]
    return float(result[0]["value"][1]) if result else None


def _evaluated_since(prometheus_url: str, moment: float) -> bool:
    groups = _api(prometheus_url, "rules", {"type": "alert"})["groups"]
    return bool(groups) and all(
        datetime.fromisoformat(rule["lastEvaluation"]).timestamp() > moment
        for group in groups
        for rule in group["rules"]
    )


def _settle(prometheus_url: str) -> None:
    """Wait until at rest: every alerting rule was evaluated after a scrape of the exporter, so
    an alert that the scraped values trigger already fires (or is pending)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    scraped: float | None = None
    while time.monotonic() < deadline:
        try:
            scraped = scraped or _first_scrape(prometheus_url)
            if scraped is not None and _evaluated_since(prometheus_url, scraped):
                return
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the stand-in cluster's Prometheus did not settle: {prometheus_url}")


def _start_prometheus(cluster: StandInGpuCluster) -> PrometheusServer:
    """A Prometheus for the cluster at the URL its service proxy was given; skips the calling
    test without the binaries."""
    port = int(cluster.prometheus_url.rsplit(":", 1)[1])
    prometheus = PrometheusServer(port=port)
    try:
        prometheus.config.write_text(prometheus_config(cluster.exporter.url))
        (prometheus.directory / RULES_FILE).write_text(rules_file())
        prometheus.start()
    except BaseException:
        prometheus.close()
        raise
    return prometheus


@contextlib.contextmanager
def running_gpu_cluster(
    scenario: Scenario, clock: Callable[[], float] = time.time
) -> Iterator[StandInGpuCluster]:
    """The stand-in cluster of ``scenario``, at rest (see ``_settle``), its controllers on
    ``clock``. Skips the calling test without the Prometheus binaries."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        cluster = StandInGpuCluster(scenario, f"http://127.0.0.1:{free_port()}", clock=clock)
        cluster.start()
        try:
            prometheus = _start_prometheus(cluster)
            break
        except RuntimeError as error:
            cluster.stop()
            # Another server took the free port before Prometheus bound it: choose another.
            if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                raise
        except BaseException:
            cluster.stop()
            raise
    try:
        _settle(prometheus.url)
        yield cluster
    finally:
        cluster.stop()
        prometheus.close()
