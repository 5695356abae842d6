"""MIG strategy and GPU sharing per node pool (infra/gpu_sharing.py), through both stacks.

Test doubles: Pulumi's mock engine for the Pulumi CLI and a cluster; the pinned device plugin and
dcgm-exporter charts from the chart cache, rendered by Helm's own engine, stand in for the
installed releases. What the device plugin then does with a configuration is NVIDIA's code and is
not run here: the tests check the configurations against the chart's own parsing of them (its
templates read ``flags.migStrategy`` of every configuration) and against the device plugin's
documented config format.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
import yaml

from infra.gpu_sharing import (
    CONFIG_LABEL,
    DevicePluginConfig,
    GpuSharingArgs,
    device_plugin_config_values,
    require_mig_capable,
    with_virtual_gpus,
)
from infra.platform import device_plugin_values
from infra.render.graph import ObjectGraph, build_graph
from infra.render.program import ProgramRun, run_stack
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK

SHARING = {
    "configs": {
        "mig-mixed": {"migStrategy": "mixed"},
        "shared-4": {"sharing": "time-slicing", "replicas": 4},
    }
}
NODE_GROUP = "eks:index:ManagedNodeGroup"


def eks_groups(**p4d: Any) -> list[dict[str, Any]]:
    return [
        {"name": "g5", "instanceTypes": ["g5.2xlarge"], "devicePluginConfig": "shared-4"},
        {"name": "p4d", "instanceTypes": ["p4d.24xlarge"], "desiredSize": 0, **p4d},
    ]


@pytest.fixture(scope="module")
def shared_eks() -> ProgramRun:
    return run_stack(
        EKS_STACK,
        overrides={
            "gpuSharing": SHARING,
            "gpuNodeGroups": eks_groups(devicePluginConfig="mig-mixed"),
            "karpenter": {"gpuLimit": 8, "devicePluginConfig": "shared-4"},
        },
    )


@pytest.fixture(scope="module")
def shared_eks_graph(shared_eks: ProgramRun) -> ObjectGraph:
    return build_graph(shared_eks)


def rendered(graph: ObjectGraph, kind: str, name: str) -> dict[str, Any]:
    found = [o.manifest for o in graph.objects if o.kind == kind and o.name == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)}"
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env") or ()}


# -- the configurations -----------------------------------------------------------------------


def test_a_time_slicing_config_is_the_device_plugins_v1_format() -> None:
    config = DevicePluginConfig("shared-4", sharing="time-slicing", replicas=4)
    assert config.document() == {
        "version": "v1",
        "flags": {"migStrategy": "none"},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": True,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
            }
        },
    }


def test_mps_and_mig_configs_say_only_what_they_set() -> None:
    mps = DevicePluginConfig("mps-2", sharing="mps", replicas=2, rename_by_default=False)
    assert mps.document()["sharing"] == {
        "mps": {
            "renameByDefault": False,
            "failRequestsGreaterThanOne": True,
            "resources": [{"name": "nvidia.com/gpu", "replicas": 2}],
        }
    }
    assert mps.experimental
    assert DevicePluginConfig("mig", mig_strategy="single").document() == {
        "version": "v1",
        "flags": {"migStrategy": "single"},
    }


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mig_strategy": "dynamic"}, "migStrategy must be one of none, single, mixed"),
        ({"sharing": "vgpu", "replicas": 2}, "sharing must be one of none, time-slicing, mps"),
        ({"sharing": "time-slicing"}, "needs replicas of at least 2"),
        ({"sharing": "time-slicing", "replicas": 1}, "needs replicas of at least 2"),
        ({"replicas": 4}, "replicas needs sharing time-slicing or mps"),
        ({"sharing": "mps", "replicas": 2, "mig_strategy": "mixed"}, "whole GPUs only"),
        ({"sharing": "mps", "replicas": 49}, "at most 48 clients"),
        ({"sharing": "time-slicing", "replicas": 2, "mig_strategy": "mixed"}, "use migStrategy"),
    ],
)
def test_a_config_that_cannot_work_is_one_clear_error(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DevicePluginConfig("c", **settings)


@pytest.mark.parametrize("name", ["", "Has Space", "-leading", "x" * 64, "a/b"])
def test_a_config_name_must_be_a_label_value(name: str) -> None:
    with pytest.raises(ValueError, match="node label value"):
        DevicePluginConfig(name)


def test_sharing_args_refuse_twins_the_reserved_name_and_an_unknown_default() -> None:
    with pytest.raises(ValueError, match="'a' is defined twice"):
        GpuSharingArgs(configs=(DevicePluginConfig("a"), DevicePluginConfig("a")))
    with pytest.raises(ValueError, match="'default' is reserved"):
        GpuSharingArgs(configs=(DevicePluginConfig("default"),))
    with pytest.raises(ValueError, match="'shared' is not defined; known: default, a"):
        GpuSharingArgs(configs=(DevicePluginConfig("a"),), default="shared")


def test_without_configs_the_device_plugin_values_are_unchanged() -> None:
    assert device_plugin_config_values(GpuSharingArgs()) == {}
    assert "config" not in device_plugin_values()
    assert "migStrategy" not in device_plugin_values()
    exporter = {"extraEnv": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    assert with_virtual_gpus(exporter, GpuSharingArgs()) == exporter
    mig_only = GpuSharingArgs(configs=(DevicePluginConfig("mig", mig_strategy="mixed"),))
    assert with_virtual_gpus(exporter, mig_only) == exporter  # MIG devices are not shared


def test_mig_on_instance_types_without_mig_is_refused() -> None:
    mig = DevicePluginConfig("mig", mig_strategy="mixed")
    with pytest.raises(ValueError, match="the GPUs of g5, g6 have no MIG"):
        require_mig_capable(mig, ["g5", "g6"], "pool")
    require_mig_capable(mig, ["p4d", "g5"], "pool")  # some instance types have it
    require_mig_capable(DevicePluginConfig("whole"), ["g5"], "pool")


# -- the EKS stack ------------------------------------------------------------------------------


def test_node_groups_and_karpenter_carry_their_config_label(shared_eks: ProgramRun) -> None:
    labels = {group.name: group.inputs["labels"] for group in shared_eks.of_type(NODE_GROUP)}
    assert labels["gpu-eks-g5-nodes"] == {
        "nvidia.com/gpu.present": "true",
        CONFIG_LABEL: "shared-4",
    }
    assert labels["gpu-eks-p4d-nodes"][CONFIG_LABEL] == "mig-mixed"
    assert CONFIG_LABEL not in labels["gpu-eks-system-nodes"]
    pool = shared_eks.one("kubernetes:karpenter.sh/v1:NodePool").inputs
    assert pool["spec"]["template"]["metadata"]["labels"][CONFIG_LABEL] == "shared-4"


def test_the_device_plugin_gets_every_config_and_the_default(shared_eks: ProgramRun) -> None:
    values = shared_eks.release("nvidia-device-plugin").inputs["values"]
    assert "migStrategy" not in values  # a top-level one would override every config's
    assert values["config"]["default"] == "default"
    documents = {name: yaml.safe_load(text) for name, text in values["config"]["map"].items()}
    assert documents["default"] == {"version": "v1", "flags": {"migStrategy": "none"}}
    assert documents["mig-mixed"]["flags"] == {"migStrategy": "mixed"}
    assert documents["shared-4"]["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]


def test_the_chart_mounts_the_configs_and_follows_the_node_label(
    shared_eks_graph: ObjectGraph,
) -> None:
    """Helm's rendering of the pinned chart: the ConfigMap holds our configurations; the plugin,
    GPU feature discovery and the MPS daemon read the one the node label names; and the chart,
    having parsed a MIG strategy in them, lets the plugin watch MIG devices."""
    configs = rendered(shared_eks_graph, "ConfigMap", "nvidia-device-plugin-configs")
    assert set(configs["data"]) == {"default", "mig-mixed", "shared-4"}
    for name in (
        "nvidia-device-plugin",
        "nvidia-device-plugin-gpu-feature-discovery",
        "nvidia-device-plugin-mps-control-daemon",
    ):
        spec = rendered(shared_eks_graph, "DaemonSet", name)["spec"]["template"]["spec"]
        sidecars = [c for c in spec["containers"] if "config-manager" in c.get("command", [])]
        assert sidecars, name
        for sidecar in sidecars:
            assert env_of(sidecar)["NODE_LABEL"] == CONFIG_LABEL
            assert env_of(sidecar)["DEFAULT_CONFIG"] == "default"
    plugin = rendered(shared_eks_graph, "DaemonSet", "nvidia-device-plugin")
    main = next(
        c
        for c in plugin["spec"]["template"]["spec"]["containers"]
        if c["name"] == "nvidia-device-plugin-ctr"
    )
    assert env_of(main)["CONFIG_FILE"] == "/config/config.yaml"
    assert env_of(main)["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert "MIG_STRATEGY" not in env_of(main)


def exporter_objects(graph: ObjectGraph) -> dict[str, dict[str, Any]]:
    """dcgm-exporter's rendered DaemonSet, ServiceAccount and pod-reading RBAC (where present)."""
    found = {}
    for kind, name in (
        ("DaemonSet", "dcgm-exporter"),
        ("ServiceAccount", "dcgm-exporter"),
        ("ClusterRole", "dcgm-exporter-read-pods"),
        ("ClusterRoleBinding", "dcgm-exporter-read-pods"),
    ):
        obj = graph.find(kind, name)
        if obj is not None:
            found[kind] = obj.manifest
    return found


def test_where_gpus_are_shared_the_exporter_can_map_pods(shared_eks_graph: ObjectGraph) -> None:
    """Helm's rendering of the pinned chart: per-pod GPU_UTIL and FB_USED need the host's PIDs
    (NVIDIA/dcgm-exporter@4.5.3-4.8.2:internal/pkg/transformation/pidmapper.go reads
    /proc/<pid>/cgroup) and the pods' UIDs, which the exporter reads from the API server only
    with the token and the RBAC that the chart renders for ``kubernetes.enablePodUID``
    (deployment/templates/daemonset.yaml, serviceaccount.yaml, clusterrole.yaml)."""
    objects = exporter_objects(shared_eks_graph)
    spec = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    assert spec["automountServiceAccountToken"] is True
    assert objects["ServiceAccount"]["automountServiceAccountToken"] is True
    (exporter,) = spec["containers"]
    env = env_of(exporter)
    assert env["KUBERNETES_VIRTUAL_GPUS"] == "true"
    assert env["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID"] == "true"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS" not in env  # no pod-label cardinality
    # NODE_NAME: the exporter's pod informer watches its own node's pods only.
    assert any(item["name"] == "NODE_NAME" for item in exporter["env"])
    (rule,) = objects["ClusterRole"]["rules"]
    assert "pods" in rule["resources"]
    assert set(rule["verbs"]) == {"get", "list", "watch"}
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "dcgm-exporter-read-pods"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dcgm-exporter", "namespace": "monitoring"}
    ]


def test_without_shared_gpus_the_exporter_keeps_no_host_pids_and_no_token(
    kubeadm_graph: ObjectGraph,
) -> None:
    """The default stack shares no GPU: one pod per GPU, no per-process mapping to need."""
    objects = exporter_objects(kubeadm_graph)
    spec = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is False
    assert spec["automountServiceAccountToken"] is False
    assert objects["ServiceAccount"]["automountServiceAccountToken"] is False
    assert "ClusterRole" not in objects
    assert "ClusterRoleBinding" not in objects
    env = env_of(spec["containers"][0])
    assert "KUBERNETES_VIRTUAL_GPUS" not in env
    assert "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID" not in env


def test_the_exporter_values_turn_on_what_pod_mapping_needs() -> None:
    values = {"kubernetes": {"enablePodLabels": False}, "extraEnv": []}
    shared = GpuSharingArgs(configs=(DevicePluginConfig("ts", sharing="time-slicing", replicas=2),))
    result = with_virtual_gpus(values, shared)
    assert result["hostPID"] is True
    assert result["kubernetes"] == {
        "enablePodLabels": False,
        "enablePodUID": True,
        "rbac": {"create": True},
    }
    assert result["extraEnv"] == [{"name": "KUBERNETES_VIRTUAL_GPUS", "value": "true"}]
    assert values == {"kubernetes": {"enablePodLabels": False}, "extraEnv": []}  # not changed


def test_the_example_stack_splits_only_the_a100_group(eks_run: ProgramRun) -> None:
    labels = {group.name: group.inputs["labels"] for group in eks_run.of_type(NODE_GROUP)}
    assert labels["gpu-eks-p4d-nodes"][CONFIG_LABEL] == "mig-mixed"
    assert CONFIG_LABEL not in labels["gpu-eks-g5-nodes"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"gpuNodeGroups": eks_groups(devicePluginConfig="mig")},
            r"gpuNodeGroups\[1\]\.devicePluginConfig: device plugin config 'mig' is not "
            r"defined in gpuSharing\.configs \(known: default, mig-mixed, shared-4\)",
        ),
        (
            {"gpuNodeGroups": [{"name": "g5", "devicePluginConfig": "mig-mixed"}]},
            r"gpuNodeGroups\[0\]\.devicePluginConfig: device plugin config 'mig-mixed' sets "
            r"migStrategy mixed, but the GPUs of g5 have no MIG",
        ),
        (
            {"karpenter": {"gpuLimit": 8, "devicePluginConfig": "mig-mixed"}},
            r"karpenter\.devicePluginConfig: .* the GPUs of g5, g6, g6e have no MIG",
        ),
        (
            {"gpuSharing": {"configs": {"c": {"sharing": "time-slicing"}}}},
            r"stack config gpuSharing: device plugin config 'c': sharing time-slicing needs "
            r"replicas of at least 2",
        ),
        (
            {"gpuSharing": {"configs": {"c": {"replica": 2}}}},
            r"stack config gpuSharing\.configs\.c has unknown keys replica",
        ),
        (
            {"gpuSharing": {"configs": {"c": {"replicas": "four"}}}},
            r"gpuSharing\.configs\.c\.replicas must be a whole number",
        ),
        (
            {"gpuSharing": {"config": {}}},
            r"stack config gpuSharing must be a mapping with keys configs, default",
        ),
        (
            {"gpuSharing": {"configs": ["mig-mixed"]}},
            r"gpuSharing\.configs must map config names to their settings",
        ),
    ],
)
def test_bad_sharing_config_stops_the_stack_with_one_line(
    overrides: dict[str, Any], message: str
) -> None:
    overrides = {"gpuSharing": SHARING, **overrides}
    with pytest.raises(pulumi.RunError, match=message) as raised:
        run_stack(EKS_STACK, overrides=overrides)
    assert "\n" not in str(raised.value)


# -- the kubeadm stack --------------------------------------------------------------------------


def test_kubeadm_nodes_get_their_config_label_in_one_patch_each() -> None:
    run = run_stack(
        KUBEADM_STACK,
        overrides={
            "gpuSharing": SHARING,
            "gpuNodeNames": ["gpu-1", "gpu-3"],
            "gpuNodeConfigs": {"gpu-1": "mig-mixed", "gpu-2": "shared-4"},
        },
    )
    patches = {
        p.inputs["metadata"]["name"]: p.inputs["metadata"]["labels"]
        for p in run.of_type("kubernetes:core/v1:NodePatch")
    }
    assert patches == {
        "gpu-1": {"nvidia.com/gpu.present": "true", CONFIG_LABEL: "mig-mixed"},
        "gpu-2": {CONFIG_LABEL: "shared-4"},
        "gpu-3": {"nvidia.com/gpu.present": "true"},
    }


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"gpu-1": "missing"}, r"gpuNodeConfigs\.gpu-1: device plugin config 'missing'"),
        (["gpu-1"], "gpuNodeConfigs must map Kubernetes node names to device plugin config"),
        ({"gpu-1": 4}, "gpuNodeConfigs must map Kubernetes node names to device plugin config"),
    ],
)
def test_kubeadm_node_configs_must_name_defined_configs(configs: object, message: str) -> None:
    with pytest.raises(pulumi.RunError, match=message):
        run_stack(KUBEADM_STACK, overrides={"gpuSharing": SHARING, "gpuNodeConfigs": configs})
