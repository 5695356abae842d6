"""GpuKarpenter: Karpenter on an EKS cluster, launching NVIDIA GPU nodes for pending GPU pods.

- ``aws_resources.py``: the controller's IAM policy; the interruption queue and its EventBridge
  rules;
- ``nodes.py``: chart values, the GPU ``EC2NodeClass`` and ``NodePool``;
- here: the component that creates them, with the nodes' role and access entry and the
  controller's role (IAM roles for service accounts through the cluster's OIDC provider).

The system node group stays an EKS managed group: Karpenter's controller runs there (its chart
keeps it off the nodes it launches).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra import versions
from infra.eks import GpuEksCluster, irsa_trust_policy, node_role
from infra.karpenter.aws_resources import controller_policy, interruption_queue
from infra.karpenter.nodes import (
    NODE_CLASS_API,
    NODE_POOL_API,
    GpuNodePoolArgs,
    ec2_node_class_spec,
    karpenter_values,
    node_pool_spec,
    placement_group_name,
)
from infra.platform import helm_release

__all__ = ["GpuKarpenter", "GpuKarpenterArgs", "GpuNodePoolArgs"]

KARPENTER_RELEASE = "karpenter"  # also its ServiceAccount's name
KARPENTER_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class GpuKarpenterArgs:
    cluster_name: str
    region: str
    node_pools: tuple[GpuNodePoolArgs, ...]


class GpuKarpenter(pulumi.ComponentResource):
    """Karpenter (controller, CRDs, IAM, interruption queue) and its GPU node pools.

    Pass the cluster's Kubernetes provider in ``opts`` (``providers=[provider]``); AWS resources
    use the default AWS provider.
    """

    def __init__(
        self,
        name: str,
        args: GpuKarpenterArgs,
        cluster: GpuEksCluster,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:GpuKarpenter", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        prefix = f"{args.cluster_name}-karpenter"

        self.node_role = node_role(name, self, role_name=f"{prefix}-node")
        # Nodes with this role may join the cluster (managed node groups get theirs from EKS).
        access = aws.eks.AccessEntry(
            f"{name}-node-access",
            cluster_name=args.cluster_name,
            principal_arn=self.node_role.arn,
            type="EC2_LINUX",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster.cluster]),
        )
        self.queue = interruption_queue(name, prefix, self)
        subject = f"system:serviceaccount:{KARPENTER_NAMESPACE}:{KARPENTER_RELEASE}"
        self.controller_role = aws.iam.Role(
            f"{name}-controller-role",
            name=f"{prefix}-controller",
            assume_role_policy=pulumi.Output.all(
                cluster.cluster.oidc_provider_arn, cluster.cluster.oidc_provider_url
            ).apply(lambda oidc: irsa_trust_policy(oidc[0], oidc[1], subject)),
            opts=child,
        )
        policy = aws.iam.RolePolicy(
            f"{name}-controller-policy",
            role=self.controller_role.name,
            policy=pulumi.Output.all(
                aws.get_caller_identity_output(
                    opts=pulumi.InvokeOutputOptions(parent=self)
                ).account_id,
                self.node_role.arn,
                self.queue.arn,
            ).apply(
                lambda out: json.dumps(
                    controller_policy(args.cluster_name, args.region, out[0], out[1], out[2])
                )
            ),
            opts=child,
        )

        crds = helm_release(
            "karpenter-crd",
            versions.KARPENTER_CRD,
            KARPENTER_NAMESPACE,
            {},
            child,
        )
        self.controller = helm_release(
            KARPENTER_RELEASE,
            versions.KARPENTER,
            KARPENTER_NAMESPACE,
            pulumi.Output.all(self.queue.name, self.controller_role.arn).apply(
                lambda out: karpenter_values(args.cluster_name, out[0], out[1])
            ),
            pulumi.ResourceOptions(parent=self, depends_on=[crds, policy, access]),
            skip_crds=True,
        )
        self.node_pools = []
        for pool in args.node_pools:
            class_depends: list[pulumi.Resource] = [crds, self.controller]
            if pool.efa:
                # EFA's low latency needs the instances close together: one spine, one zone.
                class_depends.append(
                    aws.ec2.PlacementGroup(
                        f"{name}-{pool.name}-placement-group",
                        name=placement_group_name(args.cluster_name, pool),
                        strategy="cluster",
                        opts=child,
                    )
                )
            node_class = k8s.apiextensions.CustomResource(
                f"{name}-{pool.name}-node-class",
                api_version=NODE_CLASS_API,
                kind="EC2NodeClass",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=pool.name),
                spec=self._node_class_spec(pool, args.cluster_name, cluster),
                opts=pulumi.ResourceOptions(parent=self, depends_on=class_depends),
            )
            self.node_pools.append(
                k8s.apiextensions.CustomResource(
                    f"{name}-{pool.name}-node-pool",
                    api_version=NODE_POOL_API,
                    kind="NodePool",
                    metadata=k8s.meta.v1.ObjectMetaArgs(name=pool.name),
                    spec=node_pool_spec(pool),
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[crds, self.controller, node_class]
                    ),
                )
            )
        self.register_outputs({"interruption_queue": self.queue.name})

    def _node_class_spec(
        self, pool: GpuNodePoolArgs, cluster_name: str, cluster: GpuEksCluster
    ) -> pulumi.Output[dict[str, Any]]:
        subnets = pulumi.Output.all(*cluster.private_subnet_ids)

        def spec(role_and_subnets: list[Any]) -> dict[str, Any]:
            role, subnet_ids = role_and_subnets
            return ec2_node_class_spec(pool, cluster_name, role, list(subnet_ids))

        return pulumi.Output.all(self.node_role.name, subnets).apply(spec)
