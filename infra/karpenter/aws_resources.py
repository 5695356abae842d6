"""Karpenter's AWS side: the controller's policy and the interruption queue.

The controller's policy follows the one Karpenter's getting-started CloudFormation template grants
(v1): instances, fleets, launch templates and instance profiles only with the cluster's ownership
tag, read-only describes in the cluster's region, the interruption queue, and passing the node
role to EC2. Partition ``aws`` only (not China or GovCloud).
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

# EC2 and health events that warn of an instance going away, for the interruption queue.
INTERRUPTION_EVENTS = {
    "scheduled-change": ("aws.health", "AWS Health Event"),
    "spot-interruption": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "instance-state-change": ("aws.ec2", "EC2 Instance State-change Notification"),
}
MESSAGE_RETENTION_SECONDS = 300  # an interruption notice is useless after a few minutes
NODE_POOL_TAG = "karpenter.sh/nodepool"
NODE_CLASS_TAG = "karpenter.k8s.aws/ec2nodeclass"


def _statement(sid: str, actions: list[str], resources: Any, **condition: Any) -> dict[str, Any]:
    statement = {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def controller_policy(
    cluster_name: str, region: str, node_role_arn: str, queue_arn: str
) -> dict[str, Any]:
    """The Karpenter controller's IAM policy document."""
    ec2 = f"arn:aws:ec2:{region}"
    owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    owned_resource = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    pool_requested = {f"aws:RequestTag/{NODE_POOL_TAG}": "*"}
    pool_tagged = {f"aws:ResourceTag/{NODE_POOL_TAG}": "*"}
    created = [
        f"{ec2}:*:{kind}/*"
        for kind in (
            "fleet",
            "instance",
            "volume",
            "network-interface",
            "launch-template",
            "spot-instances-request",
        )
    ]
    profile = "arn:aws:iam::*:instance-profile/*"
    region_tag = "topology.kubernetes.io/region"
    return {
        "Version": "2012-10-17",
        "Statement": [
            _statement(
                "AllowScopedEC2InstanceAccessActions",
                ["ec2:RunInstances", "ec2:CreateFleet"],
                [
                    f"{ec2}::image/*",
                    f"{ec2}::snapshot/*",
                    f"{ec2}:*:security-group/*",
                    f"{ec2}:*:subnet/*",
                    f"{ec2}:*:capacity-reservation/*",
                ],
            ),
            _statement(
                "AllowScopedEC2LaunchTemplateAccessActions",
                ["ec2:RunInstances", "ec2:CreateFleet"],
                f"{ec2}:*:launch-template/*",
                StringEquals=owned_resource,
                StringLike=pool_tagged,
            ),
            _statement(
                "AllowScopedEC2InstanceActionsWithTags",
                ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                created,
                StringEquals={**owned, "aws:RequestTag/eks:eks-cluster-name": cluster_name},
                StringLike=pool_requested,
            ),
            _statement(
                "AllowScopedResourceCreationTagging",
                ["ec2:CreateTags"],
                created,
                StringEquals={
                    **owned,
                    "aws:RequestTag/eks:eks-cluster-name": cluster_name,
                    "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                },
                StringLike=pool_requested,
            ),
            _statement(
                "AllowScopedResourceTagging",
                ["ec2:CreateTags"],
                f"{ec2}:*:instance/*",
                StringEquals=owned_resource,
                StringLike=pool_tagged,
                **{
                    "ForAllValues:StringEquals": {
                        "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                    }
                },
            ),
            _statement(
                "AllowScopedDeletion",
                ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
                [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
                StringEquals=owned_resource,
                StringLike=pool_tagged,
            ),
            _statement(
                "AllowRegionalReadActions",
                [
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeCapacityReservations",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                ],
                "*",
                StringEquals={"aws:RequestedRegion": region},
            ),
            _statement(
                "AllowSSMReadActions",
                ["ssm:GetParameter"],
                f"arn:aws:ssm:{region}::parameter/aws/service/*",
            ),
            _statement("AllowPricingReadActions", ["pricing:GetProducts"], "*"),
            _statement(
                "AllowInterruptionQueueActions",
                ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                queue_arn,
            ),
            _statement(
                "AllowPassingInstanceRole",
                ["iam:PassRole"],
                node_role_arn,
                StringEquals={"iam:PassedToService": "ec2.amazonaws.com"},
            ),
            _statement(
                "AllowScopedInstanceProfileCreationActions",
                ["iam:CreateInstanceProfile"],
                profile,
                StringEquals={**owned, f"aws:RequestTag/{region_tag}": region},
                StringLike={f"aws:RequestTag/{NODE_CLASS_TAG}": "*"},
            ),
            _statement(
                "AllowScopedInstanceProfileTagActions",
                ["iam:TagInstanceProfile"],
                profile,
                StringEquals={
                    **owned_resource,
                    f"aws:ResourceTag/{region_tag}": region,
                    **owned,
                    f"aws:RequestTag/{region_tag}": region,
                },
                StringLike={
                    f"aws:ResourceTag/{NODE_CLASS_TAG}": "*",
                    f"aws:RequestTag/{NODE_CLASS_TAG}": "*",
                },
            ),
            _statement(
                "AllowScopedInstanceProfileActions",
                [
                    "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile",
                ],
                profile,
                StringEquals={**owned_resource, f"aws:ResourceTag/{region_tag}": region},
                StringLike={f"aws:ResourceTag/{NODE_CLASS_TAG}": "*"},
            ),
            _statement(
                "AllowInstanceProfileReadActions",
                ["iam:GetInstanceProfile", "iam:ListInstanceProfiles"],
                "*",
            ),
            _statement(
                "AllowAPIServerEndpointDiscovery",
                ["eks:DescribeCluster"],
                f"arn:aws:eks:{region}:*:cluster/{cluster_name}",
            ),
        ],
    }


def queue_policy(queue_arn: str) -> dict[str, Any]:
    """Only EventBridge (and SQS itself) may send to the queue, and only over TLS."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "EventBridgeSendsInterruptions",
                "Effect": "Allow",
                "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
            },
            {
                "Sid": "DenyHTTP",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def interruption_queue(name: str, queue_name: str, parent: pulumi.Resource) -> aws.sqs.Queue:
    """The SQS queue Karpenter reads, fed by EventBridge rules for interruption events."""
    child = pulumi.ResourceOptions(parent=parent)
    queue = aws.sqs.Queue(
        f"{name}-interruption-queue",
        name=queue_name,
        message_retention_seconds=MESSAGE_RETENTION_SECONDS,
        sqs_managed_sse_enabled=True,
        opts=child,
    )
    aws.sqs.QueuePolicy(
        f"{name}-interruption-queue-policy",
        queue_url=queue.id,  # an SQS queue's id is its URL
        policy=queue.arn.apply(lambda arn: json.dumps(queue_policy(arn))),
        opts=child,
    )
    for event, (source, detail_type) in INTERRUPTION_EVENTS.items():
        rule = aws.cloudwatch.EventRule(
            f"{name}-{event}",
            name=f"{queue_name}-{event}",
            event_pattern=json.dumps({"source": [source], "detail-type": [detail_type]}),
            opts=child,
        )
        aws.cloudwatch.EventTarget(
            f"{name}-{event}-target", rule=rule.name, arn=queue.arn, opts=child
        )
    return queue
