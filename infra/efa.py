"""AWS' EFA device plugin: registers vpc.amazonaws.com/efa on the nodes of EFA groups and pools.

Pods of multi-node training request EFA interfaces as that resource (Karpenter attaches the
interfaces they request; EFA managed node groups have one on every network card). The plugin runs
only where the GPU node groups and Karpenter pools with EFA put ``EFA_NODE_LABEL``.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import versions
from infra.eks import EFA_NODE_LABEL
from infra.gpu import gpu_tolerations
from infra.platform import helm_release

EFA_DEVICE_PLUGIN_RELEASE = "aws-efa-k8s-device-plugin"
EFA_DEVICE_PLUGIN_NAMESPACE = "kube-system"


def efa_device_plugin_values() -> dict[str, Any]:
    """The chart's node affinity on our EFA label (not its list of EFA instance types, which a
    node of an EFA-capable type without EFA interfaces would match), and the GPU taint."""
    return {
        "supportedInstanceLabels": {"keys": [EFA_NODE_LABEL], "values": ["true"]},
        "tolerations": gpu_tolerations(),
    }


def efa_device_plugin(
    provider: k8s.Provider, depends_on: list[pulumi.Resource]
) -> k8s.helm.v3.Release:
    return helm_release(
        EFA_DEVICE_PLUGIN_RELEASE,
        versions.EFA_DEVICE_PLUGIN,
        EFA_DEVICE_PLUGIN_NAMESPACE,
        efa_device_plugin_values(),
        pulumi.ResourceOptions(provider=provider, depends_on=depends_on),
    )
