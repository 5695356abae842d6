"""Nothing is reachable from outside the cluster unless it was configured so."""

from __future__ import annotations

import pytest

from tests.smoke.checks.cluster import Cluster, fail_on
from tests.smoke.checks.layout import SmokeSettings

pytestmark = pytest.mark.smoke
EXPOSING_TYPES = ("NodePort", "LoadBalancer")


def test_no_service_is_exposed_unless_configured(cluster: Cluster, settings: SmokeSettings) -> None:
    problems = []
    for service in cluster.list("/api/v1/services"):
        kind = service["spec"].get("type", "ClusterIP")
        where = f"{service['metadata']['namespace']}/{service['metadata']['name']}"
        if kind in EXPOSING_TYPES and where not in settings.allowed_exposed:
            ports = ", ".join(
                str(port.get("nodePort") or port.get("port")) for port in service["spec"]["ports"]
            )
            problems.append(
                f"Service {where} is {kind} (ports {ports}): make it ClusterIP and reach it "
                f"through an Ingress or `kubectl port-forward`, or pass --allow-exposed {where} "
                "if you configured it on purpose"
            )
    fail_on(problems, "Services are exposed outside the cluster")
