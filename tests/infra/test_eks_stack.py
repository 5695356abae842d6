"""stacks/eks under Pulumi mocks: network, EKS cluster, node groups, outputs.

Test double: Pulumi's mock engine (see infra/render/program.py) instead of AWS.
"""

from __future__ import annotations

import base64
import email
import json

import pulumi
import pytest

from infra.eks import NODE_POLICIES, GpuEksClusterArgs, GpuNodeGroupArgs
from infra.render.program import (
    FAKE_KUBECONFIG,
    FAKE_OIDC_PROVIDER,
    ProgramRun,
    mock_id,
    run_stack,
)
from tests.infra.conftest import CAPACITY_BLOCK_GROUP, EKS_STACK

NODE_GROUP = "eks:index:ManagedNodeGroup"
SUBNET = "aws:ec2/subnet:Subnet"


def gpu_groups(run: ProgramRun) -> dict[str, dict[str, object]]:
    return {
        r.name: r.inputs
        for r in run.of_type(NODE_GROUP)
        if r.inputs.get("labels", {}).get("nvidia.com/gpu.present") == "true"
    }


def test_gpu_node_groups_use_nvidia_amis_with_taint_and_label(eks_run: ProgramRun) -> None:
    groups = gpu_groups(eks_run)
    assert set(groups) == {"gpu-eks-g5-nodes", "gpu-eks-p4d-nodes"}
    assert groups["gpu-eks-g5-nodes"]["amiType"] == "AL2023_x86_64_NVIDIA"
    assert groups["gpu-eks-g5-nodes"]["instanceTypes"] == ["g5.2xlarge"]
    assert groups["gpu-eks-p4d-nodes"]["amiType"] == "AL2023_x86_64_NVIDIA"
    for inputs in groups.values():
        assert inputs["taints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
        ]
    assert groups["gpu-eks-g5-nodes"]["scalingConfig"] == {
        "minSize": 0,
        "maxSize": 4,
        "desiredSize": 1,
    }


def test_system_node_group_is_cpu_only_and_untainted(eks_run: ProgramRun) -> None:
    system = eks_run.one(NODE_GROUP, "gpu-eks-system-nodes").inputs
    assert system["amiType"] == "AL2023_x86_64_STANDARD"
    assert system["instanceTypes"] == ["m6i.large"]
    assert "taints" not in system
    assert "nvidia.com/gpu.present" not in system["labels"]


def test_nodes_run_in_private_subnets_of_the_new_vpc(eks_run: ProgramRun) -> None:
    private = {r.name for r in eks_run.of_type("aws:ec2/subnet:Subnet") if "private" in r.name}
    assert private == {"gpu-eks-network-private-0", "gpu-eks-network-private-1"}
    for group in eks_run.of_type(NODE_GROUP):
        assert group.inputs["subnetIds"] == [mock_id(SUBNET, name) for name in sorted(private)]
    cidrs = [r.inputs["cidrBlock"] for r in eks_run.of_type("aws:ec2/subnet:Subnet")]
    assert len(set(cidrs)) == 4
    assert all(c.startswith("10.40.") for c in cidrs)
    for subnet in eks_run.of_type("aws:ec2/subnet:Subnet"):
        assert subnet.inputs.get("mapPublicIpOnLaunch", False) is False
        assert subnet.inputs["tags"]["kubernetes.io/cluster/gpu-dev"] == "shared"
        role = "internal-elb" if subnet.name in private else "elb"
        assert subnet.inputs["tags"][f"kubernetes.io/role/{role}"] == "1"
    associations = eks_run.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    tables = {a.inputs["subnetId"]: a.inputs["routeTableId"] for a in associations}
    assert tables == {
        mock_id(SUBNET, f"gpu-eks-network-{kind}-{index}"): f"gpu-eks-network-{kind}-routes-id"
        for kind in ("public", "private")
        for index in (0, 1)
    }


def test_cluster_inputs(eks_run: ProgramRun) -> None:
    cluster = eks_run.one("eks:index:Cluster").inputs
    assert cluster["name"] == "gpu-dev"
    assert cluster["version"] == "1.35"
    assert cluster["skipDefaultNodeGroup"] is True
    assert cluster["authenticationMode"] == "API"
    assert cluster["publicAccessCidrs"] == ["0.0.0.0/0"]  # the example narrows nothing
    assert cluster["nodeAssociatePublicIpAddress"] is False
    assert cluster["createOidcProvider"] is True


def test_network_policies_are_enforced(eks_run: ProgramRun) -> None:
    """Defect: vpc-cni ignored NetworkPolicy objects (the profiler's), unless told otherwise."""
    cluster = eks_run.one("eks:index:Cluster").inputs
    assert cluster["vpcCniOptions"]["enableNetworkPolicy"] is True


def test_example_config_reaches_the_api_from_anywhere_unless_narrowed() -> None:
    """Defect: the example allowed only 203.0.113.0/24, a documentation range."""
    for cidrs in (["203.0.113.0/24"], ["10.1.0.0/16", "198.51.100.7/32"], ["2001:db8::/48"]):
        with pytest.raises(Exception, match="is a documentation range"):
            run_stack(EKS_STACK, overrides={"publicAccessCidrs": cidrs})
    with pytest.raises(Exception, match="'office' is not a CIDR"):
        run_stack(EKS_STACK, overrides={"publicAccessCidrs": ["office"]})
    run = run_stack(EKS_STACK, overrides={"publicAccessCidrs": ["192.0.3.0/24"]})
    assert run.one("eks:index:Cluster").inputs["publicAccessCidrs"] == ["192.0.3.0/24"]


def test_node_role_has_exactly_the_worker_policies(eks_run: ProgramRun) -> None:
    attached = {
        r.inputs["policyArn"]
        for r in eks_run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.name.startswith("gpu-eks-node-role-policy-")
    }
    assert attached == set(NODE_POLICIES)


def test_ebs_csi_driver_has_its_own_role_for_its_service_account(eks_run: ProgramRun) -> None:
    """Prometheus' volume needs the EBS CSI driver; only its controller may call EBS."""
    addon = eks_run.one("aws:eks/addon:Addon", "gpu-eks-ebs-csi-driver").inputs
    assert addon["addonName"] == "aws-ebs-csi-driver"
    assert addon["clusterName"] == "gpu-dev"
    role = eks_run.one("aws:iam/role:Role", "gpu-eks-ebs-csi-role")
    assert addon["serviceAccountRoleArn"] == role.inputs["arn"]
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"].endswith(FAKE_OIDC_PROVIDER)
    assert statement["Condition"]["StringEquals"] == {
        f"{FAKE_OIDC_PROVIDER}:sub": "system:serviceaccount:kube-system:ebs-csi-controller-sa",
        f"{FAKE_OIDC_PROVIDER}:aud": "sts.amazonaws.com",
    }
    attachment = eks_run.one(
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "gpu-eks-ebs-csi-policy"
    )
    assert attachment.inputs["policyArn"].endswith("service-role/AmazonEBSCSIDriverPolicy")
    # It cannot become active before a node runs its controller.
    depends = {
        eks_run.by_urn(urn).name
        for urn in eks_run.one("aws:eks/addon:Addon", "gpu-eks-ebs-csi-driver").dependencies
    }
    assert "gpu-eks-system-nodes" in depends


def test_kubernetes_waits_for_every_node_group_and_the_storage_driver(eks_run: ProgramRun) -> None:
    """Defect: the provider waited for the GPU node groups only, not the system one."""
    provider = eks_run.one("pulumi:providers:kubernetes")
    waited = {eks_run.by_urn(urn).name for urn in provider.dependencies}
    assert {
        "gpu-eks-system-nodes",
        "gpu-eks-g5-nodes",
        "gpu-eks-p4d-nodes",
        "gpu-eks-ebs-csi-driver",
    } <= waited


def test_gpu_nodes_hand_out_gpus_only_through_the_device_plugin(eks_run: ProgramRun) -> None:
    """The toolkit on GPU nodes: volume mounts accepted, unprivileged NVIDIA_VISIBLE_DEVICES not."""
    templates = eks_run.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert {t.name for t in templates} == {
        "gpu-eks-g5-launch-template",
        "gpu-eks-p4d-launch-template",
    }
    for template in templates:
        message = email.message_from_bytes(base64.b64decode(template.inputs["userData"]))
        assert message.is_multipart()  # EKS merges it with its own nodeadm part
        (part,) = message.get_payload()
        assert part.get_content_type() == "text/x-shellscript"
        script = part.get_payload()
        assert script.startswith("#!/bin/bash\nset -euo pipefail\n")
        assert (
            "nvidia-ctk config --in-place"
            " --set accept-nvidia-visible-devices-as-volume-mounts=true"
            " --set accept-nvidia-visible-devices-envvar-when-unprivileged=false"
        ) in script
        (disk,) = template.inputs["blockDeviceMappings"]
        assert disk["ebs"]["volumeSize"] == 200
        assert disk["ebs"]["encrypted"] == "true"
        assert template.inputs["metadataOptions"]["httpTokens"] == "required"
        # pods on the pod network get no instance role credentials
        assert template.inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
    group = eks_run.one(NODE_GROUP, "gpu-eks-g5-nodes").inputs
    assert group["launchTemplate"]["id"] == "gpu-eks-g5-launch-template-id"
    assert "diskSize" not in group  # EKS refuses it beside a launch template


def test_bottlerocket_is_refused_with_the_reason() -> None:
    """Defect: Bottlerocket's own device plugin would run beside the chart's."""
    groups = [{"name": "br", "amiType": "BOTTLEROCKET_x86_64_NVIDIA"}]
    with pytest.raises(Exception, match="runs its own NVIDIA device plugin") as raised:
        run_stack(EKS_STACK, overrides={"gpuNodeGroups": groups})
    assert "AL2023_x86_64_NVIDIA" in str(raised.value)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"name": "g", "minSize": "many"}], r"gpuNodeGroups\[0\]\.minSize must be a whole number"),
        ([{"name": "g", "instanceTypes": "g5.xlarge"}], r"instanceTypes must be a non-empty list"),
        ([{"name": "g", "desired": 1}], r"gpuNodeGroups\[0\] has unknown keys desired"),
        ({"name": "g"}, "gpuNodeGroups must be a list"),
    ],
)
def test_malformed_node_groups_are_one_clear_error(groups: object, message: str) -> None:
    with pytest.raises(pulumi.RunError, match=message):
        run_stack(EKS_STACK, overrides={"gpuNodeGroups": groups})


def test_outputs_kubeconfig_and_password_are_secret(eks_run: ProgramRun) -> None:
    kubeconfig, kubeconfig_secret = eks_run.outputs["kubeconfig"]
    assert kubeconfig == FAKE_KUBECONFIG
    assert kubeconfig_secret is True
    assert eks_run.outputs["grafanaAdminPassword"][1] is True
    assert eks_run.outputs["clusterName"] == ("gpu-dev", False)
    assert eks_run.outputs["grafanaPortForward"][0] == (
        "kubectl -n monitoring port-forward svc/kube-prometheus-stack-grafana 3000:80"
    )
    assert eks_run.outputs["prometheusPortForward"][0] == (
        "kubectl -n monitoring port-forward svc/kube-prometheus-stack-prometheus 9090:9090"
    )
    # The kubeconfig reaches the Kubernetes provider as a secret too.
    provider = eks_run.one("pulumi:providers:kubernetes")
    assert "kubeconfig" in provider.secret_paths


def test_existing_vpc_skips_network_creation() -> None:
    run = run_stack(
        EKS_STACK,
        overrides={
            "existingVpcId": "vpc-0123",
            "existingPrivateSubnetIds": ["subnet-a", "subnet-b"],
            "existingPublicSubnetIds": ["subnet-c"],
        },
    )
    assert run.of_type("aws:ec2/vpc:Vpc") == []
    assert run.of_type("aws:ec2/subnet:Subnet") == []
    cluster = run.one("eks:index:Cluster").inputs
    assert cluster["vpcId"] == "vpc-0123"
    assert cluster["privateSubnetIds"] == ["subnet-a", "subnet-b"]
    for group in run.of_type(NODE_GROUP):
        assert group.inputs["subnetIds"] == ["subnet-a", "subnet-b"]


def test_non_nvidia_ami_is_refused() -> None:
    with pytest.raises(ValueError, match="has no NVIDIA driver"):
        GpuEksClusterArgs(
            cluster_name="c",
            gpu_node_groups=(
                GpuNodeGroupArgs(
                    instance_types=("g5.xlarge",),
                    min_size=0,
                    max_size=1,
                    desired_size=0,
                    ami_type="AL2023_x86_64_STANDARD",
                ),
            ),
        )


def test_cluster_without_gpu_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one GPU node group"):
        GpuEksClusterArgs(cluster_name="c", gpu_node_groups=())


def test_the_node_monitoring_agent_reports_gpu_faults(eks_run: ProgramRun) -> None:
    """What Karpenter's node repair acts on."""
    agent = eks_run.one("aws:eks/addon:Addon", "gpu-eks-node-monitoring-agent").inputs
    assert (agent["clusterName"], agent["addonName"]) == ("gpu-dev", "eks-node-monitoring-agent")


def _launch_template(run: ProgramRun, group: str) -> dict[str, object]:
    return run.one(
        "aws:ec2/launchTemplate:LaunchTemplate", f"gpu-eks-{group}-launch-template"
    ).inputs


def test_a_capacity_block_group_with_efa_and_raid0() -> None:
    """A p5.48xlarge Capacity Block, EFA on all 32 network cards in a
    cluster placement group, the group's subnets those of the block's zone, NVMe as RAID0."""
    run = run_stack(
        EKS_STACK,
        overrides={
            "availabilityZones": ["us-west-2a", "us-west-2b"],
            "gpuNodeGroups": [CAPACITY_BLOCK_GROUP],
        },
    )
    group = run.one(NODE_GROUP, "gpu-eks-h100-nodes").inputs
    assert group["capacityType"] == "CAPACITY_BLOCK"
    assert group["subnetIds"] == [mock_id(SUBNET, "gpu-eks-network-private-1")]
    assert group["labels"]["gpu-cluster.io/efa"] == "true"
    template = _launch_template(run, "h100")
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0a1b2c3d4e5f60718"}
    }
    placement = run.one("aws:ec2/placementGroup:PlacementGroup").inputs
    assert placement["strategy"] == "cluster"
    assert template["placement"] == {"groupName": placement["name"]}
    interfaces = template["networkInterfaces"]
    assert isinstance(interfaces, list)
    assert len(interfaces) == 32
    assert interfaces[0] == {
        "networkCardIndex": 0,
        "deviceIndex": 0,
        "interfaceType": "efa",
        "securityGroups": ["sg-0123456789abcdef0"],
        "deleteOnTermination": "true",
    }
    assert {
        (i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in interfaces[1:]
    } == {(card, 1, "efa-only") for card in range(1, 32)}
    user_data = email.message_from_bytes(base64.b64decode(str(template["userData"])))
    parts = {part.get_content_type(): part.get_payload() for part in user_data.get_payload()}
    assert "strategy: RAID0" in parts["application/node.eks.aws"]
    assert "nvidia-ctk config" in parts["text/x-shellscript"]
    efa = run.release("aws-efa-k8s-device-plugin").inputs
    assert efa["values"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_targeted_on_demand_reservation() -> None:
    spec = {**CAPACITY_BLOCK_GROUP, "capacityType": "ON_DEMAND", "efa": False}
    run = run_stack(EKS_STACK, overrides={"gpuNodeGroups": [spec]})
    template = _launch_template(run, "h100")
    assert "instanceMarketOptions" not in template
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0a1b2c3d4e5f60718"}
    }
    assert "networkInterfaces" not in template
    assert [r for r in run.releases() if "efa" in r.inputs["chart"]] == []


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (
            {"capacityType": "RESERVED"},
            "capacityType must be one of ON_DEMAND, SPOT, CAPACITY_BLOCK",
        ),
        ({"capacityType": "CAPACITY_BLOCK"}, "CAPACITY_BLOCK needs capacityReservationId"),
        ({"capacityType": "SPOT", "capacityReservationId": "cr-1"}, "is not spot capacity"),
        ({"efa": True}, "efa needs availabilityZone"),
        ({"availabilityZone": "eu-west-1a"}, "availabilityZone eu-west-1a has no private subnet"),
    ],
)
def test_capacity_and_efa_mistakes_are_one_clear_error(
    group: dict[str, object], message: str
) -> None:
    with pytest.raises(pulumi.RunError, match=message):
        run_stack(EKS_STACK, overrides={"gpuNodeGroups": [{"name": "h100", **group}]})
