"""The trial plan: the grid of placements, pruned, cheapest first, with its cost.

Every combination of the dimensions is a candidate. A candidate is pruned, with its reason, when
the template's pods fit no node that exists (taints, nodeSelector, allocatable GPUs per node and
in all; see ``placement.fit``), when its batch does not divide over its GPUs, or when it would
take the plan over its GPU-hour budget. The rest run cheapest first: fewest GPUs, packed before
spread. A trial's cost is its GPUs times its deadline plus its pods' capped grace period
(grace.py), the most it can hold them.

The plan is a JSON document (``PLAN_VERSION``) that ``trial run`` reads; its placements carry a
``sharing`` field, reserved for MIG profiles and time-slicing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from profiler_app.core.durations import format_duration
from profiler_app.core.errors import UserError
from profiler_app.trial.grace import DEFAULT_GRACE_SECONDS
from profiler_app.trial.manifests import (
    PYTORCH_JOB,
    BatchScaling,
    Template,
    batch_value,
    load_template,
    pod_specs,
)
from profiler_app.trial.placement import (
    ANY,
    AUTO,
    PACKED,
    Dims,
    Fit,
    GpuNode,
    Placement,
    admits,
    fit,
    model_label,
)

PLAN_VERSION = 1
SECONDS_PER_HOUR = 3600.0
Json = dict[str, Any]


def gpu_hours(gpus: int, seconds: float) -> float:
    return gpus * seconds / SECONDS_PER_HOUR


@dataclass(frozen=True)
class PlannedTrial:
    index: int
    placement: Placement
    hostnames: tuple[str, ...]  # nodes it may use (its pods are held to them without scale-up)
    nodes_used: int  # nodes it is expected to span

    def to_json(self) -> Json:
        return {
            "index": self.index,
            "placement": self.placement.to_json(),
            "hostnames": list(self.hostnames),
            "nodes_used": self.nodes_used,
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> PlannedTrial:
        return cls(
            index=int(document["index"]),
            placement=Placement.from_json(document["placement"]),
            hostnames=tuple(document["hostnames"]),
            nodes_used=int(document["nodes_used"]),
        )


@dataclass(frozen=True)
class Pruned:
    placement: Placement
    reason: str

    def to_json(self) -> Json:
        return {"placement": self.placement.to_json(), "reason": self.reason}


@dataclass
class Plan:
    template: Template
    scaling: BatchScaling
    dims: Dims
    per_trial_seconds: float
    trials: list[PlannedTrial]
    pruned: list[Pruned] = field(default_factory=list)
    nodes: list[GpuNode] = field(default_factory=list)
    budget_gpu_hours: float | None = None
    source: str = ""
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    grace_seconds: float = DEFAULT_GRACE_SECONDS

    def gpu_hours(self, per_trial_seconds: float | None = None) -> float:
        seconds = (per_trial_seconds or self.per_trial_seconds) + self.grace_seconds
        return sum(gpu_hours(t.placement.gpus, seconds) for t in self.trials)

    def to_json(self) -> Json:
        return {
            "kind": "trial-plan",
            "format_version": PLAN_VERSION,
            "created_at": self.created_at,
            "source": self.source,
            "template": self.template.to_json(),
            "scaling": self.scaling.to_json(),
            "dims": self.dims.to_json(),
            "per_trial_seconds": self.per_trial_seconds,
            "grace_seconds": self.grace_seconds,
            "budget_gpu_hours": self.budget_gpu_hours,
            "gpu_hours": round(self.gpu_hours(), 4),
            "trials": [trial.to_json() for trial in self.trials],
            "pruned": [pruned.to_json() for pruned in self.pruned],
            "nodes": [node.to_json() for node in self.nodes],
        }

    @classmethod
    def from_json(cls, document: Any, origin: str) -> Plan:
        if not isinstance(document, dict) or document.get("format_version") != PLAN_VERSION:
            raise UserError(
                f"{origin} is not a trial plan of version {PLAN_VERSION} (write one "
                "with gpu-profiler trial plan)"
            )
        try:
            template = load_template(document["template"]["manifest"], origin)
            trials = [PlannedTrial.from_json(item) for item in document["trials"]]
            return cls(
                template=template,
                scaling=BatchScaling.from_json(document["scaling"]),
                dims=Dims(),
                per_trial_seconds=float(document["per_trial_seconds"]),
                trials=trials,
                pruned=[
                    Pruned(Placement.from_json(item["placement"]), str(item["reason"]))
                    for item in document.get("pruned") or ()
                ],
                nodes=[GpuNode.from_json(item) for item in document.get("nodes") or ()],
                budget_gpu_hours=document.get("budget_gpu_hours"),
                source=str(document.get("source") or ""),
                created_at=str(document.get("created_at") or ""),
                grace_seconds=float(document.get("grace_seconds", DEFAULT_GRACE_SECONDS)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"{origin}: malformed trial plan ({error})") from None


def pod_shapes(template: Template, dims: Dims, layout: str, gpus: int) -> list[int]:
    """GPUs per pod to try for ``gpus`` in ``layout``. A Job or Pod runs one pod; a PyTorchJob
    holds every GPU in one pod when packed (processes on one node share NVLink), one GPU a pod
    when spread, unless ``per-pod`` says otherwise."""
    if template.kind != PYTORCH_JOB:
        return [gpus]
    if dims.gpus_per_pod:
        return [size for size in dims.gpus_per_pod if gpus % size == 0]
    return [gpus] if layout == PACKED else [1]


def models_to_try(dims: Dims, nodes: Sequence[GpuNode], label: str | None) -> list[str | None]:
    if dims.models == (ANY,) or label is None:
        return [None]
    found = sorted({node.labels[label] for node in nodes if label in node.labels})
    if dims.models == (AUTO,):
        return list(found) or [None]
    return list(dims.models)


def build_plan(
    template: Template,
    dims: Dims,
    nodes: Sequence[GpuNode],
    *,
    per_trial_seconds: float,
    scaling: BatchScaling | None = None,
    budget_gpu_hours: float | None = None,
    source: str = "",
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> Plan:
    """The pruned grid, cheapest first (see the module docstring)."""
    scaling = scaling or BatchScaling()
    if scaling.env is not None:
        batch_value(template, scaling, template.gpus)  # a missing variable is said once, now
    spec = next(spec for _, spec in pod_specs(copy.deepcopy(template.manifest)))
    admitting = [node for node in nodes if admits(node, spec) is None]
    refusals = [f"{node.name}: {admits(node, spec)}" for node in nodes if admits(node, spec)]
    label = model_label(admitting)
    candidates: list[tuple[Placement, Fit | str]] = []
    seen = set()
    for model in models_to_try(dims, admitting, label):
        for gpus in dims.gpus:
            for layout in dims.layouts:
                for per_pod in pod_shapes(template, dims, layout, gpus):
                    placement = Placement(gpus, per_pod, layout, model, label if model else None)
                    if placement.pods == 1 and layout != PACKED:
                        continue  # one pod is on one node: the packed trial already
                    if placement in seen:
                        continue
                    seen.add(placement)
                    candidates.append((placement, _check(placement, template, scaling, admitting)))
    if not admitting and nodes:
        listed = "; ".join(refusals[:3])
        candidates = [
            (p, f"no GPU node admits the template's pods ({listed})") for p, _ in candidates
        ]
    candidates.sort(key=lambda item: _cost_order(item[0]))
    trials: list[PlannedTrial] = []
    pruned: list[Pruned] = []
    spent = 0.0
    for placement, outcome in candidates:
        if isinstance(outcome, str):
            pruned.append(Pruned(placement, outcome))
            continue
        cost = gpu_hours(placement.gpus, per_trial_seconds + grace_seconds)
        if budget_gpu_hours is not None and spent + cost > budget_gpu_hours + 1e-9:
            pruned.append(
                Pruned(
                    placement,
                    f"over the budget: {cost:.2f} GPU-hours more than "
                    f"the {budget_gpu_hours - spent:.2f} left",
                )
            )
            continue
        spent += cost
        trials.append(PlannedTrial(len(trials), placement, outcome.hostnames, outcome.nodes_used))
    return Plan(
        template=template,
        scaling=scaling,
        dims=dims,
        per_trial_seconds=per_trial_seconds,
        trials=trials,
        pruned=pruned,
        nodes=list(nodes),
        budget_gpu_hours=budget_gpu_hours,
        source=source,
        grace_seconds=grace_seconds,
    )


def _check(
    placement: Placement, template: Template, scaling: BatchScaling, nodes: Sequence[GpuNode]
) -> Fit | str:
    try:
        batch_value(template, scaling, placement.gpus)
    except ValueError as error:
        return str(error)
    return fit(placement, nodes)


def _cost_order(placement: Placement) -> tuple[int, int, int, str]:
    return (
        placement.gpus,
        placement.layout != PACKED,
        -placement.gpus_per_pod,
        placement.model or "",
    )


def budget_refusal(
    placements: Sequence[Placement],
    per_trial_seconds: float,
    budget_gpu_hours: float,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
) -> str | None:
    """Why a run of these trials would exceed the budget, or None. A trial can hold its GPUs
    for its deadline and then its pods' grace period (capped, grace.py): both count."""
    if not placements:
        return None
    held = per_trial_seconds + grace_seconds
    cheapest = min(gpu_hours(p.gpus, held) for p in placements)
    needed = sum(gpu_hours(p.gpus, held) for p in placements)
    deadline = format_duration(per_trial_seconds)
    grace = format_duration(grace_seconds)
    if cheapest > budget_gpu_hours:
        return (
            f"--budget-gpu-hours {budget_gpu_hours:g} is too small for a single trial: the "
            f"cheapest needs {cheapest:.2f} GPU-hours at --per-trial {deadline} and "
            f"--grace-period {grace}"
        )
    if needed > budget_gpu_hours:
        return (
            f"the plan's {len(placements)} trials may hold GPUs for {needed:.2f} GPU-hours "
            f"(GPUs x (--per-trial {deadline} + --grace-period {grace})), over "
            f"--budget-gpu-hours {budget_gpu_hours:g}: raise the budget, shorten --per-trial, "
            "or plan again with --budget-gpu-hours"
        )
    return None
