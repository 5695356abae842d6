"""Volumes: the platform's StorageClass, and on clusters without a storage provisioner, Rancher's
local-path-provisioner.

The provisioner is installed from its upstream release manifest, not a chart: Rancher publishes
its chart only as a folder of the repository, never as an archive in a Helm repository, so no
published digest could pin it. The objects below are rancher/local-path-provisioner@v0.0.37:
deploy/local-path-storage.yaml, with the image and its helper pinned, the controller unprivileged
and limited, and released volumes retained. Being plain objects, they need no chart cache and no
network where ``pulumi up`` or the render runs.

A ``local-path`` volume is a folder on one node's disk (``/opt/local-path-provisioner``). It is as
durable as that disk and lives only there: a pod using it is bound to that node for good, and if
the node is lost, so is the volume. The database survives the loss of one node only through its
replica on another node (docs/store.md says what that means for failover).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from infra import versions
from infra.platform import namespace_name

LOCAL_PATH_NAME = "local-path-provisioner"
LOCAL_PATH_NAMESPACE = "local-path-storage"
LOCAL_PATH_CLASS = "local-path"
LOCAL_PATH_PROVISIONER_NAME = "rancher.io/local-path"
LOCAL_PATH_DIR = "/opt/local-path-provisioner"
LOCAL_PATH_CONFIG = "local-path-config"
LOCAL_PATH_ACCOUNT = "local-path-provisioner-service-account"
LOCAL_PATH_ROLE = "local-path-provisioner-role"
HEALTH_PORT = 8080
PROVISIONER_USER = 65534  # nobody: it only talks to the API server; helper pods touch the disk
LABELS = {"app": LOCAL_PATH_NAME}


@dataclass(frozen=True)
class StorageClassSpec:
    """A StorageClass the stack creates: the platform's block storage (Prometheus', the database's
    volumes)."""

    name: str
    provisioner: str
    parameters: dict[str, str]


def local_path_config() -> dict[str, str]:
    """The provisioner's ConfigMap: where volumes go, and the helper pod that makes and removes
    their folders (upstream's scripts; the helper image pinned instead of busybox:latest)."""
    config = {
        "nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [LOCAL_PATH_DIR]}]
    }
    helper_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/disk-pressure",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ],
            "containers": [
                {
                    "name": "helper-pod",
                    "image": versions.LOCAL_PATH_HELPER_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
        },
    }
    return {
        "config.json": json.dumps(config, indent=2),
        "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"',
        "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"',
        "helperPod.yaml": json.dumps(helper_pod, indent=2),  # JSON is YAML
    }


def _probe(path: str, delay: int, period: int, failures: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "health"},
        "initialDelaySeconds": delay,
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def local_path_deployment_spec() -> dict[str, Any]:
    """The provisioner's Deployment spec: upstream's, with its image pinned and hardened."""
    container = {
        "name": LOCAL_PATH_NAME,
        "image": versions.LOCAL_PATH_PROVISIONER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["local-path-provisioner", "start", "--config", "/etc/config/config.json"],
        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        "startupProbe": _probe("/health", 5, 5, 12),
        "livenessProbe": _probe("/health", 10, 10),
        "readinessProbe": _probe("/ready", 5, 5),
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/config/"}],
        "env": [
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
            {"name": "HEALTH_PORT", "value": str(HEALTH_PORT)},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
    }
    return {
        "replicas": 1,
        "selector": {"matchLabels": LABELS},
        "template": {
            "metadata": {"labels": LABELS},
            "spec": {
                "serviceAccountName": LOCAL_PATH_ACCOUNT,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": PROVISIONER_USER,
                    "runAsGroup": PROVISIONER_USER,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": [{"name": "config-volume", "configMap": {"name": LOCAL_PATH_CONFIG}}],
            },
        },
    }


# Upstream's RBAC, verbatim: pods in its namespace (the helper pods), and cluster-wide what a
# provisioner needs to bind claims to volumes.
NAMESPACE_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
    }
]
CLUSTER_RULES = [
    {
        "apiGroups": [""],
        "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": [""],
        "resources": ["persistentvolumes"],
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {
        "apiGroups": ["storage.k8s.io"],
        "resources": ["storageclasses"],
        "verbs": ["get", "list", "watch"],
    },
]


def local_path_provisioner(opts: pulumi.ResourceOptions) -> k8s.apps.v1.Deployment:
    """The provisioner and its ``local-path`` StorageClass, in a namespace of their own; the
    Deployment is what the database waits for.

    The namespace enforces no Pod Security level: the helper pods that create and remove the
    volume folders mount the node's disk (hostPath) as root.
    """
    namespace = k8s.core.v1.Namespace(
        "local-path-namespace",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=LOCAL_PATH_NAMESPACE),
        opts=opts,
    )
    ns = namespace_name(namespace)
    in_ns = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[namespace]))

    def meta(name: str, namespaced: bool = True) -> k8s.meta.v1.ObjectMetaArgs:
        return k8s.meta.v1.ObjectMetaArgs(
            name=name, namespace=ns if namespaced else None, labels=LABELS
        )

    subject = k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=LOCAL_PATH_ACCOUNT, namespace=ns)
    account = k8s.core.v1.ServiceAccount(
        "local-path-account", metadata=meta(LOCAL_PATH_ACCOUNT), opts=in_ns
    )
    role = k8s.rbac.v1.Role(
        "local-path-role",
        metadata=meta(LOCAL_PATH_ROLE),
        rules=cast(Any, NAMESPACE_RULES),
        opts=in_ns,
    )
    cluster_role = k8s.rbac.v1.ClusterRole(
        "local-path-cluster-role",
        metadata=meta(LOCAL_PATH_ROLE, namespaced=False),
        rules=cast(Any, CLUSTER_RULES),
        opts=opts,
    )
    bindings = [
        k8s.rbac.v1.RoleBinding(
            "local-path-binding",
            metadata=meta("local-path-provisioner-bind"),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="Role", name=LOCAL_PATH_ROLE
            ),
            subjects=[subject],
            opts=pulumi.ResourceOptions.merge(in_ns, pulumi.ResourceOptions(depends_on=[role])),
        ),
        k8s.rbac.v1.ClusterRoleBinding(
            "local-path-cluster-binding",
            metadata=meta("local-path-provisioner-bind", namespaced=False),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=LOCAL_PATH_ROLE
            ),
            subjects=[subject],
            opts=pulumi.ResourceOptions.merge(
                in_ns, pulumi.ResourceOptions(depends_on=[cluster_role])
            ),
        ),
    ]
    config = k8s.core.v1.ConfigMap(
        "local-path-config", metadata=meta(LOCAL_PATH_CONFIG), data=local_path_config(), opts=in_ns
    )
    k8s.storage.v1.StorageClass(
        "local-path-class",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=LOCAL_PATH_CLASS, labels=LABELS),
        provisioner=LOCAL_PATH_PROVISIONER_NAME,
        # A released volume keeps its folder: a deleted claim is not deleted data.
        reclaim_policy="Retain",
        volume_binding_mode="WaitForFirstConsumer",
        opts=opts,
    )
    return k8s.apps.v1.Deployment(
        "local-path-provisioner",
        metadata=meta(LOCAL_PATH_NAME),
        # Manifest-shaped (camelCase) dicts, passed through as the API server takes them.
        spec=cast(Any, local_path_deployment_spec()),
        opts=pulumi.ResourceOptions.merge(
            in_ns, pulumi.ResourceOptions(depends_on=[account, config, *bindings])
        ),
    )
