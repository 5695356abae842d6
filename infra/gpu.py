"""How GPU nodes are marked, shared by the cluster components and the workloads that target them."""

from __future__ import annotations

GPU_RESOURCE = "nvidia.com/gpu"

# GPU nodes carry this taint so that only pods that tolerate it (GPU workloads, the device plugin,
# dcgm-exporter, the profiler) land there.
GPU_TAINT_KEY = GPU_RESOURCE
GPU_TAINT_VALUE = "present"
GPU_TAINT_EFFECT = "NoSchedule"

# The label NVIDIA's GPU feature discovery also sets; cluster components set it themselves so that
# selectors work before any NVIDIA software runs on the node.
GPU_NODE_LABEL_KEY = "nvidia.com/gpu.present"
GPU_NODE_LABEL_VALUE = "true"


def gpu_node_selector() -> dict[str, str]:
    """The node selector of pods that must run on every GPU node and nowhere else."""
    return {GPU_NODE_LABEL_KEY: GPU_NODE_LABEL_VALUE}


def gpu_tolerations() -> list[dict[str, str]]:
    """Tolerations (Kubernetes wire format) that let a pod onto tainted GPU nodes."""
    return [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": GPU_TAINT_EFFECT}]
