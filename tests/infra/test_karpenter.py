"""GpuKarpenter in stacks/eks under Pulumi mocks: IAM, interruption queue, charts, node pool.

Test double: Pulumi's mock engine instead of AWS and a Kubernetes API server; the recorded inputs
are what AWS and helm would receive. The rendered charts and the NodePool and EC2NodeClass
against the CRDs of the pinned karpenter-crd chart are checked in test_render_schema.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra import versions
from infra.eks import gpu_node_user_data
from infra.render.program import (
    FAKE_ACCOUNT_ID,
    FAKE_OIDC_PROVIDER,
    ProgramRun,
    mock_id,
    run_stack,
)
from tests.infra.conftest import EKS_STACK, H100_POOL

NODE_POOL = "kubernetes:karpenter.sh/v1:NodePool"
NODE_CLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
ROLE = "aws:iam/role:Role"
NODE_GROUP = "eks:index:ManagedNodeGroup"
REFERENCE = Path(__file__).parent / "data" / "karpenter-v1.14.1-iam.yaml"
SSM_MANAGED_INSTANCE = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


def statements(run: ProgramRun) -> dict[str, dict[str, Any]]:
    policy = json.loads(run.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    return {s["Sid"]: s for s in policy["Statement"]}


def test_gpu_node_pool_launches_nodes_like_the_gpu_node_groups(eks_run: ProgramRun) -> None:
    spec = eks_run.one(NODE_POOL).inputs["spec"]
    template = spec["template"]
    assert template["metadata"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert template["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    requirements = {
        r["key"]: (r["operator"], r["values"]) for r in template["spec"]["requirements"]
    }
    assert requirements["karpenter.k8s.aws/instance-gpu-manufacturer"] == ("In", ["nvidia"])
    assert requirements["karpenter.k8s.aws/instance-family"] == ("In", ["g5", "g6", "g6e"])
    assert requirements["karpenter.sh/capacity-type"] == ("In", ["on-demand"])
    assert template["spec"]["nodeClassRef"] == {
        "group": "karpenter.k8s.aws",
        "kind": "EC2NodeClass",
        "name": "gpu",
    }
    assert spec["limits"] == {"nvidia.com/gpu": "8"}
    assert spec["disruption"] == {
        "consolidationPolicy": "WhenEmptyOrUnderutilized",
        "consolidateAfter": "10m",
    }


def test_node_class_uses_the_nvidia_al2023_family_private_subnets_and_toolkit_settings(
    eks_run: ProgramRun,
) -> None:
    spec = eks_run.one(NODE_CLASS).inputs["spec"]
    assert spec["amiSelectorTerms"] == [{"alias": "al2023@latest"}]
    assert spec["role"] == "gpu-dev-karpenter-node"
    assert spec["subnetSelectorTerms"] == [
        {"id": mock_id("aws:ec2/subnet:Subnet", f"gpu-eks-network-private-{i}")} for i in (0, 1)
    ]
    assert spec["securityGroupSelectorTerms"] == [{"tags": {"aws:eks:cluster-name": "gpu-dev"}}]
    # GPUs only through the device plugin, as on the managed GPU node groups.
    assert spec["userData"] == gpu_node_user_data()
    assert spec["metadataOptions"]["httpTokens"] == "required"
    assert spec["metadataOptions"]["httpPutResponseHopLimit"] == 1  # no role for pod networks
    (disk,) = spec["blockDeviceMappings"]
    assert disk["ebs"]["encrypted"] is True


def test_nodes_join_with_their_own_role_and_access_entry(eks_run: ProgramRun) -> None:
    role = eks_run.one(ROLE, "karpenter-node-role").inputs
    assert role["name"] == "gpu-dev-karpenter-node"
    attached = {
        r.inputs["policyArn"]
        for r in eks_run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.name.startswith("karpenter-node-role-policy-")
    }
    assert attached == {
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
        "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
        "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    }
    access = eks_run.one("aws:eks/accessEntry:AccessEntry").inputs
    assert access == {
        "clusterName": "gpu-dev",
        "principalArn": role["arn"],
        "type": "EC2_LINUX",
        "arn": access["arn"],
    }


def test_controller_role_is_trusted_by_its_service_account_only(eks_run: ProgramRun) -> None:
    role = eks_run.one(ROLE, "karpenter-controller-role").inputs
    (trust,) = json.loads(role["assumeRolePolicy"])["Statement"]
    assert trust["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert trust["Condition"]["StringEquals"] == {
        f"{FAKE_OIDC_PROVIDER}:sub": "system:serviceaccount:kube-system:karpenter",
        f"{FAKE_OIDC_PROVIDER}:aud": "sts.amazonaws.com",
    }
    values = eks_run.release("oci://public.ecr.aws/karpenter/karpenter").inputs["values"]
    assert values["serviceAccount"]["annotations"] == {"eks.amazonaws.com/role-arn": role["arn"]}


def test_controller_policy_is_scoped_to_the_cluster(eks_run: ProgramRun) -> None:
    found = statements(eks_run)
    node_role = eks_run.one(ROLE, "karpenter-node-role").inputs["arn"]
    queue = eks_run.one("aws:sqs/queue:Queue").inputs["arn"]
    assert found["AllowPassingInstanceRole"]["Resource"] == node_role
    assert found["AllowPassingInstanceRole"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}
    }
    assert found["AllowInterruptionQueueActions"]["Resource"] == queue
    owned = {"aws:ResourceTag/kubernetes.io/cluster/gpu-dev": "owned"}
    assert found["AllowScopedDeletion"]["Condition"]["StringEquals"] == owned
    assert found["AllowScopedDeletion"]["Action"] == [
        "ec2:TerminateInstances",
        "ec2:DeleteLaunchTemplate",
    ]
    assert found["AllowRegionalReadActions"]["Condition"] == {
        "StringEquals": {"aws:RequestedRegion": "us-west-2"}
    }
    assert found["AllowAPIServerEndpointDiscovery"]["Resource"] == (
        f"arn:aws:eks:us-west-2:{FAKE_ACCOUNT_ID}:cluster/gpu-dev"
    )
    assert found["AllowInstanceProfileReadActions"]["Resource"] == (
        f"arn:aws:iam::{FAKE_ACCOUNT_ID}:instance-profile/*"
    )
    # Every write is conditioned on the cluster's tags; only reads and PassRole are not.
    unconditioned = {sid for sid, s in found.items() if "Condition" not in s}
    assert unconditioned == {
        "AllowScopedEC2InstanceAccessActions",  # images, subnets, security groups: not ours
        "AllowSSMReadActions",
        "AllowPricingReadActions",
        "AllowInterruptionQueueActions",
        "AllowInstanceProfileReadActions",
        "AllowUnscopedInstanceProfileListAction",
        "AllowAPIServerEndpointDiscovery",
    }
    # On any resource without a condition: reads only.
    for statement in found.values():
        if statement["Resource"] == "*" and "Condition" not in statement:
            verbs = {action.split(":")[1] for action in statement["Action"]}
            assert all(v.startswith(("Get", "List", "Describe")) for v in verbs), statement


def _reference_facts() -> dict[str, Any]:
    facts: dict[str, Any] = yaml.safe_load(REFERENCE.read_text())
    return facts


def _placeholders(text: str) -> str:
    """Our policy's values as the reference's placeholders."""
    return (
        text.replace("gpu-dev", "{cluster}")
        .replace("us-west-2", "{region}")
        .replace(FAKE_ACCOUNT_ID, "{account}")
    )


def test_controller_policy_is_the_reference_policy_of_the_pinned_version(
    eks_run: ProgramRun,
) -> None:
    """The policy of Karpenter's own CloudFormation template at the chart's
    version: every statement's actions, resources and condition keys."""
    assert versions.KARPENTER.version == REFERENCE.stem.split("-v")[1].removesuffix("-iam")
    found = statements(eks_run)
    node_role = eks_run.one(ROLE, "karpenter-node-role").inputs["arn"]
    queue = eks_run.one("aws:sqs/queue:Queue").inputs["arn"]
    ours = {}
    for sid, statement in found.items():
        resources = statement["Resource"]
        resources = [resources] if isinstance(resources, str) else resources
        ours[sid] = {
            "actions": sorted(statement["Action"]),
            "resources": sorted(
                _placeholders(r).replace(node_role, "{node_role_arn}").replace(queue, "{queue_arn}")
                for r in resources
            ),
            "condition_keys": {
                operator: sorted(_placeholders(key) for key in keys)
                for operator, keys in (statement.get("Condition") or {}).items()
            },
        }
    reference = _reference_facts()["statements"]
    assert set(ours) == set(reference)
    for sid, facts in reference.items():
        assert ours[sid] == facts, sid
    all_actions = {a for s in found.values() for a in s["Action"]}
    assert {
        "ec2:DescribeInstanceStatus",
        "ec2:DescribePlacementGroups",
        "arc-zonal-shift:GetManagedResource",
    } <= all_actions


def test_the_interruption_queue_and_node_role_follow_the_reference(eks_run: ProgramRun) -> None:
    facts = _reference_facts()
    rules = {
        (pattern["source"][0], pattern["detail-type"][0])
        for pattern in (
            json.loads(r.inputs["eventPattern"])
            for r in eks_run.of_type("aws:cloudwatch/eventRule:EventRule")
        )
    }
    assert rules == {(e["source"], e["detail_type"]) for e in facts["interruption_events"]}
    attached = {
        r.inputs["policyArn"]
        for r in eks_run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.name.startswith("karpenter-node-role-policy-")
    }
    # The reference's, less SSM's managed-instance policy (no SSM agent access is granted).
    assert attached == set(facts["node_role_policies"]) - {SSM_MANAGED_INSTANCE}


def test_interruption_queue_gets_every_kind_of_event(eks_run: ProgramRun) -> None:
    queue = eks_run.one("aws:sqs/queue:Queue").inputs
    assert queue["name"] == "gpu-dev-karpenter"
    assert (queue["messageRetentionSeconds"], queue["sqsManagedSseEnabled"]) == (300, True)
    patterns = {
        json.loads(r.inputs["eventPattern"])["detail-type"][0]
        for r in eks_run.of_type("aws:cloudwatch/eventRule:EventRule")
    }
    assert patterns == {
        "AWS Health Event",
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
        "EC2 Instance State-change Notification",
        "EC2 Capacity Reservation Instance Interruption Warning",
    }
    targets = eks_run.of_type("aws:cloudwatch/eventTarget:EventTarget")
    assert {t.inputs["arn"] for t in targets} == {queue["arn"]}
    policy = json.loads(eks_run.one("aws:sqs/queuePolicy:QueuePolicy").inputs["policy"])
    allow, deny = policy["Statement"]
    assert allow["Principal"]["Service"] == ["events.amazonaws.com", "sqs.amazonaws.com"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    values = eks_run.release("oci://public.ecr.aws/karpenter/karpenter").inputs["values"]
    assert values["settings"] == {
        "clusterName": "gpu-dev",
        "interruptionQueue": "gpu-dev-karpenter",
        # Nodes whose conditions stay bad (the node monitoring agent's GPU faults) are replaced.
        "featureGates": {"nodeRepair": True, "reservedCapacity": True},
    }


def test_charts_are_pinned_and_the_crds_have_their_own(eks_run: ProgramRun) -> None:
    crds = eks_run.release("oci://public.ecr.aws/karpenter/karpenter-crd").inputs
    controller = eks_run.release("oci://public.ecr.aws/karpenter/karpenter").inputs
    # The CRDs must be those of the controller's release.
    assert crds["version"] == controller["version"] == versions.KARPENTER.version
    assert (crds["namespace"], controller["namespace"]) == ("kube-system", "kube-system")
    assert "repositoryOpts" not in controller  # an OCI chart is named by its URL
    assert controller["skipCrds"] is True
    assert "skipCrds" not in crds
    depends = {eks_run.by_urn(u).name for u in eks_run.one(NODE_POOL).dependencies}
    assert {"karpenter", "karpenter-crd", "karpenter-gpu-node-class"} <= depends


def test_the_system_node_group_stays_managed(eks_run: ProgramRun) -> None:
    assert eks_run.one(NODE_GROUP, "gpu-eks-system-nodes").inputs["amiType"] == (
        "AL2023_x86_64_STANDARD"
    )


def test_karpenter_can_be_turned_off() -> None:
    run = run_stack(EKS_STACK, overrides={"karpenter": {"enabled": False}})
    assert [r for r in run.resources if "karpenter" in r.typ.lower() + r.name] == []
    assert run.of_type("aws:sqs/queue:Queue") == []
    with pytest.raises(pulumi.RunError, match="at least one GPU node group, or Karpenter"):
        run_stack(EKS_STACK, overrides={"karpenter": {"enabled": False}, "gpuNodeGroups": []})


def test_karpenter_alone_provides_gpu_nodes() -> None:
    run = run_stack(
        EKS_STACK,
        overrides={
            "gpuNodeGroups": [],
            "karpenter": {"capacityTypes": ["spot", "on-demand"], "gpuLimit": 32},
        },
    )
    assert [g.name for g in run.of_type(NODE_GROUP)] == ["gpu-eks-system-nodes"]
    spec = run.one(NODE_POOL).inputs["spec"]
    (capacity,) = [
        r
        for r in spec["template"]["spec"]["requirements"]
        if r["key"] == "karpenter.sh/capacity-type"
    ]
    assert capacity["values"] == ["spot", "on-demand"]
    assert spec["limits"] == {"nvidia.com/gpu": "32"}


@pytest.mark.parametrize(
    ("karpenter", "message"),
    [
        (
            {"gpuLimit": 8, "capacityTypes": ["preemptible"]},
            "capacityTypes must be some of on-demand, spot, reserved",
        ),
        ({"gpuLimit": 8, "consolidateAfter": "10 minutes"}, "consolidateAfter must be a duration"),
        ({"gpuLimit": 0}, "gpuLimit must be at least 1"),
        ({"gpuLimit": 8, "expireAfter": "720h"}, "expireAfter 720h needs a terminationGracePeriod"),
        ({"gpuLimit": 8, "expireAfter": "30 days"}, "expireAfter must be a duration"),
        (
            {"gpuLimit": 8, "expireAfter": "720h", "terminationGracePeriod": "Never"},
            "terminationGracePeriod must be a duration",
        ),
        ({"consolidateAfter": "10m"}, "karpenter.gpuLimit is needed"),
        ({"gpuLimit": 8, "amiAlias": "al2@latest"}, "amiAlias must be an Amazon Linux 2023 alias"),
        (
            {"gpuLimit": 8, "capacityTypes": ["reserved"]},
            "capacityTypes reserved and capacityReservationIds go together",
        ),
        (
            {"gpuLimit": 8, "capacityTypes": ["reserved"], "capacityReservationIds": ["r-1"]},
            r"capacityReservationIds must be cr-\.\.\. ids",
        ),
        ({"gpuLimit": 8, "efa": True}, "efa needs availabilityZone"),
        ({"enabled": "maybe"}, r"karpenter\.enabled must be true or false"),
        ({"gpuLimits": 4}, "karpenter has unknown keys gpuLimits"),
        ({"instanceFamilies": "g5"}, "instanceFamilies must be a non-empty list"),
        (["g5"], "karpenter must be a mapping"),
    ],
)
def test_malformed_karpenter_config_is_one_clear_error(karpenter: object, message: str) -> None:
    with pytest.raises(pulumi.RunError, match=message):
        run_stack(EKS_STACK, overrides={"karpenter": karpenter})


def test_an_h100_pool_uses_its_reservations_efa_and_raid0() -> None:
    """P5/p5e from capacity reservations or Capacity Blocks first,
    EFA in a cluster placement group of one zone, instance-store NVMe as RAID0."""
    run = run_stack(EKS_STACK, overrides={"karpenter": H100_POOL})
    node_class = run.one(NODE_CLASS).inputs["spec"]
    assert node_class["capacityReservationSelectorTerms"] == [{"id": "cr-0123456789abcdef0"}]
    assert node_class["placementGroupSelector"] == {"name": "gpu-dev-gpu-efa"}
    assert node_class["instanceStorePolicy"] == "RAID0"
    group = run.one("aws:ec2/placementGroup:PlacementGroup").inputs
    assert (group["name"], group["strategy"]) == ("gpu-dev-gpu-efa", "cluster")
    spec = run.one(NODE_POOL).inputs["spec"]
    requirements = {r["key"]: r["values"] for r in spec["template"]["spec"]["requirements"]}
    assert requirements["karpenter.k8s.aws/instance-family"] == ["p5", "p5e"]
    assert requirements["karpenter.sh/capacity-type"] == ["reserved", "on-demand"]
    assert requirements["topology.kubernetes.io/zone"] == ["us-west-2b"]
    assert spec["template"]["metadata"]["labels"]["gpu-cluster.io/efa"] == "true"
    assert spec["limits"] == {"nvidia.com/gpu": "32"}
    efa = run.release("aws-efa-k8s-device-plugin").inputs
    assert efa["version"] == versions.EFA_DEVICE_PLUGIN.version
    assert efa["values"]["supportedInstanceLabels"] == {
        "keys": ["gpu-cluster.io/efa"],
        "values": ["true"],
    }


def test_pools_without_efa_install_no_efa_device_plugin(eks_run: ProgramRun) -> None:
    assert [r for r in eks_run.releases() if "efa" in r.inputs["chart"]] == []
    spec = eks_run.one(NODE_CLASS).inputs["spec"]
    assert not {"capacityReservationSelectorTerms", "placementGroupSelector"} & set(spec)
    assert eks_run.of_type("aws:ec2/placementGroup:PlacementGroup") == []


def test_the_region_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(pulumi.RunError, match=r"aws:region \(or AWS_REGION\) is needed"):
        run_stack(EKS_STACK, overrides={"aws:region": None})


def test_gpu_nodes_do_not_expire_under_protected_training_by_default(eks_run: ProgramRun) -> None:
    """Expiration is forceful: with the chart's default (720h) and no terminationGracePeriod, a
    node expiring under a do-not-disrupt training pod would stay half drained while it runs."""
    template = eks_run.one(NODE_POOL).inputs["spec"]["template"]["spec"]
    assert template["expireAfter"] == "Never"
    assert "terminationGracePeriod" not in template


def test_a_node_lifetime_comes_with_a_termination_grace_period() -> None:
    run = run_stack(
        EKS_STACK,
        overrides={
            "karpenter": {"gpuLimit": 8, "expireAfter": "720h", "terminationGracePeriod": "48h"}
        },
    )
    template = run.one(NODE_POOL).inputs["spec"]["template"]["spec"]
    assert (template["expireAfter"], template["terminationGracePeriod"]) == ("720h", "48h")
