"""Trial placements and the GPU nodes that can hold them.

A placement is how one trial of a training job runs: its GPUs, split over pods of equal size,
packed on one node or spread over several, on one GPU model (or any). ``sharing`` is reserved
for a MIG profile or time-slicing; the planner does not set it yet.

Nodes are read as the scheduler sees them: allocatable ``nvidia.com/gpu``, labels, taints and
cordons. The GPU model comes from GPU Feature Discovery's ``nvidia.com/gpu.product``; where no
node has it (EKS without GFD) from ``node.kubernetes.io/instance-type``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from profiler_app.core.errors import UserError

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # every cloud node, EKS included
HOSTNAME_LABEL = "kubernetes.io/hostname"
PACKED, SPREAD = "packed", "spread"
LAYOUTS = (PACKED, SPREAD)
AUTO, ANY = "auto", "any"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
DEFAULT_GPUS = (1, 2, 4)

Json = dict[str, Any]


@dataclass(frozen=True)
class Placement:
    """One trial's shape; ``model`` is a value of ``model_label`` (None: any GPU)."""

    gpus: int
    gpus_per_pod: int
    layout: str
    model: str | None = None
    model_label: str | None = None
    sharing: str | None = None  # reserved: a MIG profile or time-slicing (not planned yet)

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_pod < 1 or self.gpus % self.gpus_per_pod:
            raise ValueError(f"{self.gpus} GPUs do not split into pods of {self.gpus_per_pod}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}")

    @property
    def pods(self) -> int:
        return self.gpus // self.gpus_per_pod

    def describe(self) -> str:
        """E.g. '4 GPUs spread (4 pods x 1) on NVIDIA-A10G'."""
        noun = "GPU" if self.gpus == 1 else "GPUs"
        text = f"{self.gpus} {noun}"
        if self.pods > 1 or self.layout == SPREAD:
            text += f" {self.layout} ({self.pods} pods x {self.gpus_per_pod})"
        elif self.gpus > 1:
            text += f" {self.layout}"
        return text + (f" on {self.model}" if self.model else "")

    def to_json(self) -> Json:
        return {
            "gpus": self.gpus,
            "gpus_per_pod": self.gpus_per_pod,
            "pods": self.pods,
            "layout": self.layout,
            "model": self.model,
            "model_label": self.model_label,
            "sharing": self.sharing,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Placement:
        return cls(
            gpus=int(document["gpus"]),
            gpus_per_pod=int(document["gpus_per_pod"]),
            layout=str(document["layout"]),
            model=document.get("model"),
            model_label=document.get("model_label"),
            sharing=document.get("sharing"),
        )


@dataclass(frozen=True)
class Dims:
    """The grid to try: total GPUs, layouts, GPU models (``auto``: every model the nodes have;
    ``any``: no model constraint) and GPUs per pod (None: chosen per layout, see ``shapes``)."""

    gpus: tuple[int, ...] = DEFAULT_GPUS
    layouts: tuple[str, ...] = LAYOUTS
    models: tuple[str, ...] = (AUTO,)
    gpus_per_pod: tuple[int, ...] | None = None

    def to_json(self) -> Json:
        return {
            "gpus": list(self.gpus),
            "layout": list(self.layouts),
            "model": list(self.models),
            "per-pod": list(self.gpus_per_pod) if self.gpus_per_pod else None,
        }


def _positive_ints(name: str, values: list[str]) -> tuple[int, ...]:
    try:
        numbers = tuple(sorted({int(value) for value in values}))
    except ValueError:
        numbers = ()
    if not numbers or numbers[0] < 1:
        raise UserError(f"--dims {name}= takes positive whole numbers, e.g. {name}=1,2,4")
    return numbers


def parse_dims(tokens: Sequence[str]) -> Dims:
    """``gpus=1,2,4 layout=packed,spread model=auto per-pod=1`` (each part optional)."""
    parts: dict[str, list[str]] = {}
    for token in tokens:
        name, equals, text = token.partition("=")
        values = [value.strip() for value in text.split(",") if value.strip()]
        if not equals or not values or name in parts:
            raise UserError(
                f"--dims: malformed {token!r}: use NAME=V1,V2 with NAME one of gpus, layout, "
                "model, per-pod, each once"
            )
        parts[name] = values
    unknown = set(parts) - {"gpus", "layout", "model", "per-pod"}
    if unknown:
        raise UserError(
            f"--dims: unknown dimension {sorted(unknown)[0]!r}: use gpus, layout, "
            "model or per-pod (MIG profiles and time-slicing are not planned yet)"
        )
    layouts = tuple(dict.fromkeys(parts.get("layout", LAYOUTS)))
    if bad := [layout for layout in layouts if layout not in LAYOUTS]:
        raise UserError(f"--dims: unknown layout {bad[0]!r}: use packed, spread")
    models = tuple(dict.fromkeys(parts.get("model", [AUTO])))
    if len(models) > 1 and (AUTO in models or ANY in models):
        raise UserError("--dims: model=auto and model=any stand alone")
    return Dims(
        gpus=_positive_ints("gpus", parts["gpus"]) if "gpus" in parts else DEFAULT_GPUS,
        layouts=layouts,
        models=models,
        gpus_per_pod=_positive_ints("per-pod", parts["per-pod"]) if "per-pod" in parts else None,
    )


@dataclass(frozen=True)
class GpuNode:
    """A schedulable node with allocatable GPUs."""

    name: str
    gpus: int
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_api(cls, node: Mapping[str, Any]) -> GpuNode | None:
        """The node as the API server returns it; None when it holds no GPU for new pods
        (no allocatable GPU, cordoned, or not Ready)."""
        metadata, spec, status = (
            node.get("metadata", {}),
            node.get("spec", {}),
            node.get("status", {}),
        )
        try:
            gpus = int(str((status.get("allocatable") or {}).get(GPU_RESOURCE, "0")))
        except ValueError:
            gpus = 0
        ready = any(
            condition.get("type") == "Ready" and condition.get("status") == "True"
            for condition in status.get("conditions") or ()
        )
        if gpus < 1 or spec.get("unschedulable") or not ready:
            return None
        return cls(
            name=str(metadata["name"]),
            gpus=gpus,
            labels=dict(metadata.get("labels") or {}),
            taints=tuple(spec.get("taints") or ()),
        )

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "gpus": self.gpus,
            "labels": dict(self.labels),
            "taints": list(self.taints),
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> GpuNode:
        return cls(
            name=str(document["name"]),
            gpus=int(document["gpus"]),
            labels=dict(document.get("labels") or {}),
            taints=tuple(document.get("taints") or ()),
        )


def model_label(nodes: Iterable[GpuNode]) -> str | None:
    """The label that names GPU models on these nodes: GFD's product, else the instance type."""
    listed = list(nodes)
    for label in (PRODUCT_LABEL, INSTANCE_TYPE_LABEL):
        if any(label in node.labels for node in listed):
            return label
    return None


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if (toleration.get("operator") or "Equal") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and str(toleration.get("value") or "") == str(
            taint.get("value") or ""
        ):
            return True
    return False


def admits(node: GpuNode, pod_spec: Mapping[str, Any]) -> str | None:
    """Why the node refuses the template's pods (taints, nodeSelector), or None."""
    tolerations = pod_spec.get("tolerations") or ()
    for taint in node.taints:
        if taint.get("effect") in BLOCKING_EFFECTS and not _tolerated(taint, tolerations):
            return f"taint {taint.get('key')} not tolerated"
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != str(value):
            return f"nodeSelector {key}={value} does not match"
    return None


@dataclass(frozen=True)
class Fit:
    """Where a placement fits: the nodes it may use, and how many it is expected to span."""

    hostnames: tuple[str, ...]
    nodes_used: int


def fit(placement: Placement, nodes: Sequence[GpuNode]) -> Fit | str:
    """The nodes a placement fits on (already filtered to those admitting the template), or
    why it fits nowhere. Packed: one node holds every GPU. Spread: the pods spread evenly
    (the scheduler's ``maxSkew: 1``) over as many nodes as can hold them, two at least."""
    model_nodes = [
        node
        for node in nodes
        if placement.model is None
        or (placement.model_label and node.labels.get(placement.model_label) == placement.model)
    ]
    where = f" of {placement.model}" if placement.model else ""
    if not model_nodes:
        return f"no schedulable GPU node{where}"
    most = max(node.gpus for node in model_nodes)
    if placement.layout == PACKED:
        holders = tuple(sorted(n.name for n in model_nodes if n.gpus >= placement.gpus))
        if not holders:
            return f"no node{where} has {placement.gpus} allocatable GPUs (at most {most})"
        return Fit(holders, 1)
    if placement.pods < 2:
        return "one pod cannot spread over nodes"
    slots = sorted((node.gpus // placement.gpus_per_pod for node in model_nodes), reverse=True)
    names = sorted(
        (n for n in model_nodes if n.gpus >= placement.gpus_per_pod),
        key=lambda n: (-n.gpus, n.name),
    )
    for count in range(min(placement.pods, len(names)), 1, -1):
        # Balanced over `count` nodes: each takes floor or ceil of pods / count.
        per_node = math.ceil(placement.pods / count)
        heavy = placement.pods - (per_node - 1) * count
        chosen = slots[:count]
        if min(chosen) >= per_node - 1 and sum(1 for s in chosen if s >= per_node) >= heavy:
            return Fit(tuple(sorted(n.name for n in names[:count])), count)
    return (
        f"{placement.pods} pods of {placement.gpus_per_pod} GPUs do not spread over two or "
        f"more nodes{where}"
    )
