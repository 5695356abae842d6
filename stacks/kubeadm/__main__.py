"""kubeadm stack: KubeadmCluster (Ansible), GpuPlatform, GpuProfiler. Config: stacks/README.md."""

from __future__ import annotations

from pathlib import Path

import pulumi

from infra import stack_config
from infra.kubeadm import (
    KubeadmCluster,
    KubeadmClusterArgs,
    gpu_node_configs,
    gpu_node_names,
    label_gpu_nodes,
)
from infra.stack import check_settings, deploy_gpu_layer, export_access, gpu_sharing_args

STACK_DIR = Path(__file__).resolve().parent


def cluster_args(config: pulumi.Config) -> KubeadmClusterArgs:
    inventory = Path(config.require("inventory"))
    key_file = stack_config.optional_text(config, "sshPrivateKeyFile")
    return KubeadmClusterArgs(
        cluster_name=config.get("clusterName") or "gpu-cluster",
        # Relative paths in stack config are relative to this folder.
        inventory=str(inventory if inventory.is_absolute() else STACK_DIR / inventory),
        extra_vars=config.get_object("ansibleExtraVars") or {},
        ssh_private_key_file=key_file and str(Path(key_file).expanduser()),
        ssh_key_passphrase=stack_config.optional_secret(config, "sshKeyPassphrase"),
        become_password=stack_config.optional_secret(config, "becomePassword"),
        kubeconfig_dest=stack_config.optional_text(config, "kubeconfigDest"),
    )


check_settings(STACK_DIR)
config = pulumi.Config()
# Device plugin configurations (MIG strategy, sharing) that gpuNodeConfigs assigns to nodes.
sharing = gpu_sharing_args(config)
try:
    node_configs = gpu_node_configs(stack_config.read_object(config, "gpuNodeConfigs"), sharing)
except ValueError as error:
    raise stack_config.ConfigError(f"stack config {error}") from None
cluster = KubeadmCluster("gpu-kubeadm", cluster_args(config))
layer = deploy_gpu_layer(config, cluster.kubeconfig, gpu_sharing=sharing)
# The playbooks label and taint the gpu_nodes hosts; gpuNodeNames (optional) labels other nodes too,
# and gpuNodeConfigs labels nodes with the device plugin configuration they use.
label_gpu_nodes(
    gpu_node_names(config.get_object("gpuNodeNames")), layer.provider, node_configs, sharing
)
export_access(cluster.cluster_name, cluster.kubeconfig, layer)
