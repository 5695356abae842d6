"""kube-prometheus-stack's Prometheus, reached through the API server's service proxy."""

from __future__ import annotations

from typing import Any

from tests.smoke.checks.cluster import Cluster, SmokeError
from tests.smoke.checks.layout import PROMETHEUS_PORT, PROMETHEUS_SERVICE

Json = dict[str, Any]
# dcgm-exporter names the node in `Hostname` up to the pinned version, in `hostname` after.
NODE_LABELS = ("Hostname", "hostname")


class Prometheus:
    """The HTTP API of the cluster's Prometheus."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self._cluster = cluster
        self.service = f"{namespace}/{PROMETHEUS_SERVICE}:{PROMETHEUS_PORT}"

    def _data(self, path: str, query: dict[str, str]) -> Any:
        answer = self._cluster.proxy(self.service, path, query=query)
        try:
            document = answer.json()
        except ValueError:
            document = None
        if answer.status != 200 or not isinstance(document, dict):
            raise SmokeError(
                f"Prometheus ({self.service}) answered {answer.status} to {path}: "
                f"{answer.text()[:300]}"
            )
        if document.get("status") != "success":
            raise SmokeError(f"Prometheus ({self.service}) {path}: {document.get('error')}")
        return document["data"]

    def query(self, expression: str) -> list[Json]:
        """An instant query's samples: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self._data("api/v1/query", {"query": expression})
        return list(data.get("result") or [])

    def alerting_rules(self) -> list[Json]:
        """Every alerting rule Prometheus has loaded, with its state and active alerts."""
        data = self._data("api/v1/rules", {"type": "alert"})
        return [rule for group in data.get("groups") or [] for rule in group.get("rules") or []]

    def gpus_by_node(self, metric: str) -> dict[str, set[str]]:
        """The GPU UUIDs that have a current series of ``metric``, by node name."""
        found: dict[str, set[str]] = {}
        expression = f"count by ({', '.join(NODE_LABELS)}, UUID) ({metric})"
        for sample in self.query(expression):
            labels = sample["metric"]
            node = next((labels[key] for key in NODE_LABELS if labels.get(key)), "")
            found.setdefault(node, set()).add(labels.get("UUID", ""))
        return found
