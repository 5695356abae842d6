"""Volumes: the platform's StorageClass, and on clusters without a storage provisioner, Rancher's
local-path-provisioner.

A ``local-path`` volume is a folder on one node's disk (``/opt/local-path-provisioner``). It is as
durable as that disk and lives only there: a pod using it is bound to that node for good, and if
the node is lost, so is the volume. The database survives the loss of one node only through its
replica on another node (docs/store.md says what that means for failover).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import versions
from infra.platform import helm_release, namespace_name

LOCAL_PATH_RELEASE = "local-path-provisioner"
LOCAL_PATH_NAMESPACE = "local-path-storage"
LOCAL_PATH_CLASS = "local-path"
LOCAL_PATH_DIR = "/opt/local-path-provisioner"
PROVISIONER_USER = 65534  # nobody: it only talks to the API server; helper pods touch the disk


@dataclass(frozen=True)
class StorageClassSpec:
    """A StorageClass the stack creates: the platform's block storage (Prometheus', the database's
    volumes)."""

    name: str
    provisioner: str
    parameters: dict[str, str]


def local_path_values() -> dict[str, Any]:
    """Values of the local-path-provisioner chart."""
    helper_repository, helper_tag = versions.LOCAL_PATH_HELPER_IMAGE
    return {
        "storageClass": {
            "create": True,
            "name": LOCAL_PATH_CLASS,
            "defaultClass": False,
            # A released volume keeps its folder: a deleted claim is not deleted data.
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
        "nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [LOCAL_PATH_DIR]}],
        "helperImage": {"repository": helper_repository, "tag": helper_tag},
        "podSecurityContext": {
            "runAsNonRoot": True,
            "runAsUser": PROVISIONER_USER,
            "runAsGroup": PROVISIONER_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
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


def local_path_provisioner(opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    """The provisioner and its ``local-path`` StorageClass, in a namespace of their own.

    The namespace enforces no Pod Security level: the helper pods that create and remove the
    volume folders mount the node's disk (hostPath) as root.
    """
    namespace = k8s.core.v1.Namespace(
        "local-path-namespace",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=LOCAL_PATH_NAMESPACE),
        opts=opts,
    )
    return helm_release(
        LOCAL_PATH_RELEASE,
        versions.LOCAL_PATH_PROVISIONER,
        namespace_name(namespace),
        local_path_values(),
        pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[namespace])),
    )
