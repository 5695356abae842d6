"""The trial grid: enumeration, pruning by nodes and budget, cheapest-first order, the plan file,
and the budget arithmetic that refuses a run before anything is created."""

from __future__ import annotations

import json
from typing import Any

import pytest

from profiler_app.core.errors import UserError
from profiler_app.trial.manifests import STRONG, BatchScaling, load_template
from profiler_app.trial.placement import (
    INSTANCE_TYPE_LABEL,
    PRODUCT_LABEL,
    Dims,
    GpuNode,
    Placement,
    fit,
    parse_dims,
)
from profiler_app.trial.plan import Plan, budget_refusal, build_plan, gpu_hours
from tests.unit.test_trial_manifests import job, pytorch_job

TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(name: str, gpus: int, product: str | None = "NVIDIA-A10G", **labels: str) -> GpuNode:
    found = {"kubernetes.io/hostname": name, **labels}
    if product:
        found[PRODUCT_LABEL] = product
    return GpuNode(name, gpus, found, (TAINT,))


NODES = [node("a", 4), node("b", 4), node("c", 8, "NVIDIA-H100-80GB-HBM3")]


def described(plan: Plan) -> list[str]:
    return [t.placement.describe() for t in plan.trials]


def test_dims_parse_and_refuse_in_one_line() -> None:
    dims = parse_dims(["gpus=4,1,2", "layout=spread", "model=NVIDIA-A10G", "per-pod=1"])
    assert dims == Dims((1, 2, 4), ("spread",), ("NVIDIA-A10G",), (1,))
    assert parse_dims([]) == Dims()
    for bad, message in [
        (["gpus=0"], "positive whole numbers"),
        (["gpus=two"], "positive whole numbers"),
        (["layout=diagonal"], "unknown layout"),
        (["mig=1g.10gb"], "unknown dimension 'mig'"),
        (["gpus"], "malformed"),
        (["model=auto,NVIDIA-A10G"], "stand alone"),
    ]:
        with pytest.raises(UserError, match=message):
            parse_dims(bad)


def test_pytorch_job_grid_is_pruned_by_what_nodes_hold() -> None:
    plan = build_plan(
        load_template(pytorch_job(), "ptj"),
        parse_dims(["gpus=1,2,4,8"]),
        NODES,
        per_trial_seconds=600,
    )
    assert described(plan) == [
        "1 GPU on NVIDIA-A10G",
        "1 GPU on NVIDIA-H100-80GB-HBM3",
        "2 GPUs packed on NVIDIA-A10G",
        "2 GPUs packed on NVIDIA-H100-80GB-HBM3",
        "2 GPUs spread (2 pods x 1) on NVIDIA-A10G",
        "4 GPUs packed on NVIDIA-A10G",
        "4 GPUs packed on NVIDIA-H100-80GB-HBM3",
        "4 GPUs spread (4 pods x 1) on NVIDIA-A10G",
        "8 GPUs packed on NVIDIA-H100-80GB-HBM3",
        "8 GPUs spread (8 pods x 1) on NVIDIA-A10G",
    ]
    assert [t.index for t in plan.trials] == list(range(10))
    pruned = {p.placement.describe(): p.reason for p in plan.pruned}
    assert pruned["8 GPUs packed on NVIDIA-A10G"] == (
        "no node of NVIDIA-A10G has 8 allocatable GPUs (at most 4)"
    )
    assert (
        "do not spread over two or more nodes"
        in pruned["2 GPUs spread (2 pods x 1) on NVIDIA-H100-80GB-HBM3"]
    )
    spread = next(t for t in plan.trials if t.placement.describe().startswith("8 GPUs spread"))
    assert (spread.hostnames, spread.nodes_used) == (("a", "b"), 2)
    # Each trial: its deadline, then up to the 30 s grace period of its pods.
    assert plan.gpu_hours() == pytest.approx(sum((1, 1, 2, 2, 2, 4, 4, 4, 8, 8)) * 630 / 3600)


def test_a_job_runs_one_pod_so_it_only_packs() -> None:
    plan = build_plan(
        load_template(job(), "job"),
        parse_dims(["gpus=1,2,8", "model=any"]),
        NODES,
        per_trial_seconds=600,
    )
    assert described(plan) == ["1 GPU", "2 GPUs packed", "8 GPUs packed"]
    assert plan.trials[2].hostnames == ("c",)


def test_nodes_the_template_cannot_use_are_left_out() -> None:
    untainted = job()
    untainted["spec"]["template"]["spec"]["tolerations"] = []
    plan = build_plan(
        load_template(untainted, "job"), Dims(gpus=(1,)), NODES, per_trial_seconds=600
    )
    assert plan.trials == []
    assert "taint nvidia.com/gpu not tolerated" in plan.pruned[0].reason
    picky = job()
    picky["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "big"}
    nodes = [*NODES[:2], node("d", 8, "NVIDIA-A10G", pool="big")]
    plan = build_plan(load_template(picky, "job"), Dims(gpus=(2,)), nodes, per_trial_seconds=60)
    assert [t.hostnames for t in plan.trials] == [("d",)]


def test_eks_without_gfd_falls_back_to_the_instance_type() -> None:
    nodes = [
        node(n, 4, None, **{INSTANCE_TYPE_LABEL: kind})
        for n, kind in (("a", "g5.12xlarge"), ("b", "g6.12xlarge"))
    ]
    plan = build_plan(load_template(job(), "job"), Dims(gpus=(1,)), nodes, per_trial_seconds=60)
    assert [(t.placement.model_label, t.placement.model) for t in plan.trials] == [
        (INSTANCE_TYPE_LABEL, "g5.12xlarge"),
        (INSTANCE_TYPE_LABEL, "g6.12xlarge"),
    ]


def test_the_budget_prunes_the_dearest_trials() -> None:
    plan = build_plan(
        load_template(job(), "job"),
        parse_dims(["gpus=1,2,4", "model=any"]),
        NODES,
        per_trial_seconds=1770,
        budget_gpu_hours=2.0,
    )
    # Each trial 1,770 s and a 30 s grace period: 0.5 + 1.0 GPU-hours.
    assert described(plan) == ["1 GPU", "2 GPUs packed"]
    (pruned,) = plan.pruned
    assert pruned.reason == "over the budget: 2.00 GPU-hours more than the 0.50 left"


def test_a_batch_that_does_not_split_is_pruned() -> None:
    plan = build_plan(
        load_template(job(), "job"),
        parse_dims(["gpus=1,3", "model=any"]),
        [node("c", 8)],
        per_trial_seconds=60,
        scaling=BatchScaling(STRONG, "BATCH_SIZE", "per-gpu"),
    )
    assert described(plan) == ["1 GPU"]
    assert plan.pruned[0].reason == "global batch 64 does not split over 3 GPUs"


def test_spread_uses_as_many_nodes_as_can_hold_an_even_share() -> None:
    placement = Placement(6, 1, "spread")
    nodes = [node("a", 2), node("b", 2), node("c", 2), node("d", 1)]
    result = fit(placement, nodes)
    assert not isinstance(result, str)
    assert (result.hostnames, result.nodes_used) == (("a", "b", "c", "d"), 4)  # 2, 2, 1, 1
    assert isinstance(fit(Placement(6, 1, "spread"), nodes[2:]), str)


def test_the_plan_file_round_trips() -> None:
    plan = build_plan(
        load_template(pytorch_job(), "ptj"),
        parse_dims(["gpus=1,2"]),
        NODES,
        per_trial_seconds=600,
        budget_gpu_hours=5.0,
        source="ptj.yaml",
    )
    document: dict[str, Any] = json.loads(json.dumps(plan.to_json()))
    assert (document["kind"], document["format_version"]) == ("trial-plan", 1)
    assert document["trials"][0]["placement"]["sharing"] is None  # room for MIG, time-slicing
    again = Plan.from_json(document, "plan.json")
    assert again.trials == plan.trials
    assert again.template.manifest == plan.template.manifest
    assert again.scaling == plan.scaling
    with pytest.raises(UserError, match="not a trial plan of version 1"):
        Plan.from_json({"kind": "trial-plan", "format_version": 9}, "plan.json")


def test_budget_arithmetic() -> None:
    assert gpu_hours(4, 1800) == 2.0
    placements = [Placement(1, 1, "packed"), Placement(2, 2, "packed"), Placement(4, 1, "spread")]
    # 7 GPUs for 10 minutes (9.5 and a 30 s grace period): 7/6 GPU-hours.
    assert budget_refusal(placements, 570, 7 / 6) is None
    assert budget_refusal(placements, 600, 7 / 6, grace_seconds=0) is None
    over = budget_refusal(placements, 600, 7 / 6)  # the grace period counts
    assert over is not None
    assert "1.22 GPU-hours" in over
    assert "--grace-period 30s" in over
    too_much = budget_refusal(placements, 570, 1.0)
    assert too_much is not None
    assert "1.17 GPU-hours" in too_much
    too_small = budget_refusal(placements, 570, 0.1)
    assert too_small is not None
    assert "too small for a single trial" in too_small
    assert "0.17 GPU-hours" in too_small
