"""stacks/eks under Pulumi mocks: network, EKS cluster, node groups, outputs.

Test double: Pulumi's mock engine (see infra/render/program.py) instead of AWS.
"""

from __future__ import annotations

import pytest

from infra.eks import NODE_POLICIES, GpuEksClusterArgs, GpuNodeGroupArgs
from tests.infra.conftest import EKS_STACK
from infra.render.program import FAKE_KUBECONFIG, ProgramRun, run_stack

NODE_GROUP = "eks:index:ManagedNodeGroup"


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
    assert groups["gpu-eks-p4d-nodes"]["amiType"] == "BOTTLEROCKET_x86_64_NVIDIA"
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
        assert group.inputs["subnetIds"] == [f"{name}-id" for name in sorted(private)]
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
        f"gpu-eks-network-{kind}-{index}-id": f"gpu-eks-network-{kind}-routes-id"
        for kind in ("public", "private")
        for index in (0, 1)
    }


def test_cluster_inputs(eks_run: ProgramRun) -> None:
    cluster = eks_run.one("eks:index:Cluster").inputs
    assert cluster["name"] == "gpu-dev"
    assert cluster["version"] == "1.31"
    assert cluster["skipDefaultNodeGroup"] is True
    assert cluster["authenticationMode"] == "API"
    assert cluster["publicAccessCidrs"] == ["203.0.113.0/24"]
    assert cluster["nodeAssociatePublicIpAddress"] is False


def test_node_role_has_exactly_the_worker_policies(eks_run: ProgramRun) -> None:
    attached = {
        r.inputs["policyArn"]
        for r in eks_run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert attached == set(NODE_POLICIES)


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
