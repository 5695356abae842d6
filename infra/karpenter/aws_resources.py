"""Karpenter's AWS side: the controller's policy and the interruption queue.

The controller's policy is the one Karpenter's getting-started CloudFormation template grants at the
pinned version (v1.14.1; tests/infra/test_karpenter.py compares the two): instances, fleets, launch
templates and instance profiles only with the cluster's ownership tags, read-only describes in the
cluster's region, the interruption queue, passing the node role to EC2, and reading the cluster's
zonal shift status. Partition ``aws`` only (not China or GovCloud).
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
    # A capacity reservation (or Capacity Block) that ends takes its instances with it.
    "reservation-interruption": (
        "aws.ec2",
        "EC2 Capacity Reservation Instance Interruption Warning",
    ),
}
MESSAGE_RETENTION_SECONDS = 300  # an interruption notice is useless after a few minutes
NODE_POOL_TAG = "karpenter.sh/nodepool"
NODE_CLASS_TAG = "karpenter.k8s.aws/ec2nodeclass"
CLUSTER_NAME_TAG = "eks:eks-cluster-name"
REGION_TAG = "topology.kubernetes.io/region"
# What Karpenter needs to read without a resource scope (describes are region-scoped below).
REGIONAL_READ_ACTIONS = (
    "ec2:DescribeCapacityReservations",
    "ec2:DescribeImages",
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceStatus",  # its instance-status health checks, from v1.12
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribePlacementGroups",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSpotPriceHistory",
    "ec2:DescribeSubnets",
)


def _statement(sid: str, actions: list[str], resources: Any, **condition: Any) -> dict[str, Any]:
    statement = {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def _ec2_statements(cluster_name: str, region: str) -> list[dict[str, Any]]:
    """Launching, tagging and deleting the cluster's instances and launch templates."""
    ec2 = f"arn:aws:ec2:{region}"
    owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    owned_resource = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    named = {f"aws:RequestTag/{CLUSTER_NAME_TAG}": cluster_name}
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
    return [
        _statement(
            "AllowScopedEC2InstanceAccessActions",
            ["ec2:RunInstances", "ec2:CreateFleet"],
            [
                f"{ec2}::image/*",
                f"{ec2}::snapshot/*",
                f"{ec2}:*:security-group/*",
                f"{ec2}:*:subnet/*",
                f"{ec2}:*:capacity-reservation/*",
                f"{ec2}:*:placement-group/*",
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
            StringEquals={**owned, **named},
            StringLike=pool_requested,
        ),
        _statement(
            "AllowScopedResourceCreationTagging",
            ["ec2:CreateTags"],
            created,
            StringEquals={
                **owned,
                **named,
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
            StringEqualsIfExists=named,
            **{
                "ForAllValues:StringEquals": {
                    "aws:TagKeys": [CLUSTER_NAME_TAG, "karpenter.sh/nodeclaim", "Name"]
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
    ]


def _instance_profile_statements(
    cluster_name: str, region: str, account_id: str, node_role_arn: str
) -> list[dict[str, Any]]:
    """Passing the node role to EC2, and the instance profiles Karpenter makes for it."""
    owned = {f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    owned_resource = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    in_region = {f"aws:RequestTag/{REGION_TAG}": region}
    resource_in_region = {f"aws:ResourceTag/{REGION_TAG}": region}
    named = {f"aws:RequestTag/{CLUSTER_NAME_TAG}": cluster_name}
    profile = f"arn:aws:iam::{account_id}:instance-profile/*"
    return [
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
            StringEquals={**owned, **named, **in_region},
            StringLike={f"aws:RequestTag/{NODE_CLASS_TAG}": "*"},
        ),
        _statement(
            "AllowScopedInstanceProfileTagActions",
            ["iam:TagInstanceProfile"],
            profile,
            StringEquals={**owned_resource, **resource_in_region, **owned, **named, **in_region},
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
            StringEquals={**owned_resource, **resource_in_region},
            StringLike={f"aws:ResourceTag/{NODE_CLASS_TAG}": "*"},
        ),
        _statement("AllowUnscopedInstanceProfileListAction", ["iam:ListInstanceProfiles"], "*"),
        _statement("AllowInstanceProfileReadActions", ["iam:GetInstanceProfile"], profile),
    ]


def controller_policy(
    cluster_name: str, region: str, account_id: str, node_role_arn: str, queue_arn: str
) -> dict[str, Any]:
    """The Karpenter controller's IAM policy document."""
    cluster_arn = f"arn:aws:eks:{region}:{account_id}:cluster/{cluster_name}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            *_ec2_statements(cluster_name, region),
            *_instance_profile_statements(cluster_name, region, account_id, node_role_arn),
            _statement("AllowAPIServerEndpointDiscovery", ["eks:DescribeCluster"], cluster_arn),
            _statement(
                "AllowInterruptionQueueActions",
                ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                queue_arn,
            ),
            # Karpenter avoids a zone that ARC's zonal shift moved the cluster's traffic away from.
            _statement(
                "AllowZonalShiftStatusReadOnly",
                ["arc-zonal-shift:GetManagedResource"],
                "*",
                StringEquals={"arc-zonal-shift:ResourceIdentifier": cluster_arn},
            ),
            _statement(
                "AllowRegionalReadActions",
                list(REGIONAL_READ_ACTIONS),
                "*",
                StringEquals={"aws:RequestedRegion": region},
            ),
            _statement(
                "AllowSSMReadActions",
                ["ssm:GetParameter"],
                f"arn:aws:ssm:{region}::parameter/aws/service/*",
            ),
            _statement("AllowPricingReadActions", ["pricing:GetProducts"], "*"),
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
