"""A VPC for an EKS cluster: public subnets for load balancers, private ones for nodes."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class VpcArgs:
    """Address plan of the VPC."""

    cidr_block: str = "10.0.0.0/16"
    availability_zones: tuple[str, ...] = ()  # empty: the region's first two
    subnet_prefix_length: int = 20


class Vpc(pulumi.ComponentResource):
    """One public and one private subnet per availability zone, one NAT gateway for egress."""

    vpc_id: pulumi.Output[str]
    public_subnet_ids: list[pulumi.Output[str]]
    private_subnet_ids: list[pulumi.Output[str]]
    zones: list[str]  # of the subnets, in their order

    def __init__(
        self,
        name: str,
        args: VpcArgs,
        cluster_name: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:Vpc", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        zones = (
            list(args.availability_zones)
            or (
                aws.get_availability_zones(
                    state="available", opts=pulumi.InvokeOptions(parent=self)
                ).names[:2]
            )
        )
        subnets = ipaddress.ip_network(args.cidr_block).subnets(
            new_prefix=args.subnet_prefix_length
        )
        cluster_tag = {f"kubernetes.io/cluster/{cluster_name}": "shared"}

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr_block,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": f"{cluster_name}-vpc"},
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, opts=child)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public-routes",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=gateway.id)],
            opts=child,
        )

        def tier(kind: str, role: str, routes: aws.ec2.RouteTable) -> list[aws.ec2.Subnet]:
            """One subnet per zone, all on one route table; instances get no public address."""
            tier_subnets: list[aws.ec2.Subnet] = []
            for index, zone in enumerate(zones):
                subnet = aws.ec2.Subnet(
                    f"{name}-{kind}-{index}",
                    vpc_id=vpc.id,
                    availability_zone=zone,
                    cidr_block=str(next(subnets)),
                    map_public_ip_on_launch=False,
                    tags={**cluster_tag, role: "1", "Name": f"{cluster_name}-{kind}-{zone}"},
                    opts=child,
                )
                aws.ec2.RouteTableAssociation(
                    f"{name}-{kind}-{index}-routes",
                    subnet_id=subnet.id,
                    route_table_id=routes.id,
                    opts=child,
                )
                tier_subnets.append(subnet)
            return tier_subnets

        public = tier("public", "kubernetes.io/role/elb", public_routes)
        nat_ip = aws.ec2.Eip(f"{name}-nat-ip", domain="vpc", opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat", subnet_id=public[0].id, allocation_id=nat_ip.id, opts=child
        )
        private_routes = aws.ec2.RouteTable(
            f"{name}-private-routes",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
            opts=child,
        )
        private = tier("private", "kubernetes.io/role/internal-elb", private_routes)

        self.vpc_id = vpc.id
        self.zones = list(zones)
        self.public_subnet_ids = [s.id for s in public]
        self.private_subnet_ids = [s.id for s in private]
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "public_subnet_ids": self.public_subnet_ids,
                "private_subnet_ids": self.private_subnet_ids,
            }
        )
