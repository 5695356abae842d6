"""The store as a Grafana data source: the read-only user, TLS verified, provisioned by the sidecar.

Grafana runs in the monitoring namespace, the database elsewhere: the reader's password (a Secret)
and the CA's certificate (a ConfigMap) get copies there, made by Pulumi from the same values. The
password reaches Grafana as an environment variable that the provisioning file names
(``$__env{...}``), so it is in no ConfigMap; the CA is mounted as a file.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.store.endpoint import CA_CONFIG_MAP, CA_KEY, PASSWORD_KEY, USERNAME_KEY, StoreEndpoint

DATASOURCE_UID = "gpu-profiler-store"  # what the history dashboard's panels name
DATASOURCE_NAME = "GPU profiler store"
DATASOURCE_LABEL = "grafana_datasource"  # kube-prometheus-stack's datasource sidecar label
READER_SECRET = "gpu-profiler-store-reader"  # noqa: S105  a Secret's name
PASSWORD_VARIABLE = "GPU_PROFILER_STORE_PASSWORD"  # noqa: S105  a variable's name
CA_DIR = "/etc/grafana/gpu-profiler-store-ca"
# Grafana's connections to the pooler: few, a dashboard's queries at a time.
MAX_OPEN_CONNECTIONS = 5


def datasource_document(host: str, endpoint: StoreEndpoint) -> str:
    """The provisioning file (YAML) of the data source."""
    document = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": DATASOURCE_NAME,
                "uid": DATASOURCE_UID,
                "type": "postgres",
                "access": "proxy",
                "url": f"{host}:{endpoint.port}",
                "user": endpoint.reader.name,
                "editable": False,
                "jsonData": {
                    "database": endpoint.database,
                    "sslmode": "verify-full",
                    "tlsConfigurationMethod": "file-path",
                    "sslRootCertFile": f"{CA_DIR}/{CA_KEY}",
                    "postgresVersion": 1000,  # Grafana's code for 10 and later
                    "timescaledb": False,
                    "maxOpenConns": MAX_OPEN_CONNECTIONS,
                    "maxIdleConnsAuto": True,
                    "connMaxLifetime": 14400,
                },
                "secureJsonData": {"password": f"$__env{{{PASSWORD_VARIABLE}}}"},
            }
        ],
    }
    return yaml.safe_dump(document, sort_keys=False)


def grafana_values() -> dict[str, Any]:
    """Grafana's chart values that hand it the password and the CA."""
    return {
        "envValueFrom": {
            PASSWORD_VARIABLE: {"secretKeyRef": {"name": READER_SECRET, "key": PASSWORD_KEY}}
        },
        "extraConfigmapMounts": [
            {
                "name": "gpu-profiler-store-ca",
                "mountPath": CA_DIR,
                "configMap": CA_CONFIG_MAP,
                "readOnly": True,
            }
        ],
    }


def grafana_store_objects(
    endpoint: StoreEndpoint, namespace: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> list[pulumi.Resource]:
    """The reader's Secret, the CA and the data source in Grafana's namespace.

    The Secret and the CA must exist before Grafana starts: its pod refers to both.
    """
    return [
        k8s.core.v1.Secret(
            "grafana-store-reader-secret",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=READER_SECRET, namespace=namespace),
            type="kubernetes.io/basic-auth",
            string_data={
                USERNAME_KEY: endpoint.reader.name,
                PASSWORD_KEY: endpoint.reader.password,
            },
            opts=opts,
        ),
        k8s.core.v1.ConfigMap(
            "grafana-store-ca",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=CA_CONFIG_MAP, namespace=namespace),
            data={CA_KEY: endpoint.ca_certificate},
            opts=opts,
        ),
        k8s.core.v1.ConfigMap(
            "grafana-store-datasource",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name="grafana-datasource-gpu-profiler-store",
                namespace=namespace,
                labels={DATASOURCE_LABEL: "1"},
            ),
            data={
                "gpu-profiler-store.yaml": pulumi.Output.from_input(endpoint.host).apply(
                    lambda host: datasource_document(host, endpoint)
                )
            },
            opts=opts,
        ),
    ]
