"""The profiler's store as the stacks record it under Pulumi mocks: the kinds of object it makes,
the names its clients use, and lookups into a run.

Test double: Pulumi's mock engine instead of the Pulumi CLI, AWS and a Kubernetes API server
(infra/render/program.py); generated passwords, keys and certificates are placeholders. What the
objects become in a cluster (schemas against the CloudNativePG chart's CRDs, Services, scheduling,
volume claims, Secret wiring) is checked on the rendered graph in test_render.py; the connection
the daemon makes from this wiring runs against a real PostgreSQL and PgBouncer in
tests/integration/test_store_wiring.py.
"""

from __future__ import annotations

from typing import Any

import yaml

from infra.render.program import ProgramRun, Recorded

CLUSTER = "kubernetes:postgresql.cnpg.io/v1:Cluster"
SECRET = "kubernetes:core/v1:Secret"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NAMESPACE = "kubernetes:core/v1:Namespace"
DAEMON_SET = "kubernetes:apps/v1:DaemonSet"
CA_FILE = "/etc/gpu-profiler/store-ca/ca.crt"


def daemon_env(run: ProgramRun) -> dict[str, Any]:
    (container,) = run.one(DAEMON_SET).get("spec.template.spec.containers")
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def named(run: ProgramRun, typ: str, name: str, namespace: str | None = None) -> Recorded:
    found = [
        r
        for r in run.of_type(typ)
        if r.inputs["metadata"]["name"] == name
        and (namespace is None or r.inputs["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"{typ} {namespace}/{name}: {len(found)} found"
    return found[0]


def datasource(run: ProgramRun) -> dict[str, Any]:
    config_map = named(run, CONFIG_MAP, "grafana-datasource-gpu-profiler-store")
    assert config_map.inputs["metadata"]["labels"] == {"grafana_datasource": "1"}
    (source,) = yaml.safe_load(config_map.inputs["data"]["gpu-profiler-store.yaml"])["datasources"]
    found: dict[str, Any] = source
    return found
