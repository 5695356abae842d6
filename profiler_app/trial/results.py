"""Trial results as rows, their Pareto front and the recommendation.

Throughput is made comparable across placements: a rate the job reports (estimator 1) is taken
as it is; a step rate becomes work per second, steps/s times GPUs when each GPU keeps its batch
(weak scaling, in per-GPU batches/s) and steps/s when the global batch is split (strong). Rows
are compared only with rows of the same estimator (and unit): the recommendation uses the most
preferred estimator that measured a trial, and scaling efficiency is against the smallest
placement of the same GPU model so measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from profiler_app.trial.estimators import ESTIMATORS, Measurement
from profiler_app.trial.manifests import WEAK
from profiler_app.trial.placement import PACKED, Placement

OK, PREDICTED = "ok", "predicted"
FAILED, UNSCHEDULABLE, UNMEASURED, CANCELLED = "failed", "unschedulable", "unmeasured", "cancelled"
STATUSES = (OK, PREDICTED, FAILED, UNSCHEDULABLE, UNMEASURED, CANCELLED)
DEFAULT_GOOD_ENOUGH = 0.90  # of the best throughput, for the recommendation

COLUMNS = [
    "trial", "placement", "gpu_model", "gpus", "gpus_per_pod", "pods", "nodes", "layout",
    "status", "estimator", "throughput", "unit", "throughput_per_gpu", "scaling_efficiency",
    "step_seconds", "peak_fb_mib", "sm_active", "gpu_seconds", "pareto", "recommended", "note",
]  # fmt: skip


@dataclass
class TrialResult:
    """One trial's outcome."""

    index: int
    name: str
    placement: Placement
    nodes_used: int
    status: str
    measurement: Measurement | None = None
    note: str = ""
    gpu_seconds: float = 0.0
    peak_fb_mib: float | None = None
    sm_active: float | None = None
    # Filled by ``summarise``:
    throughput: float | None = None
    unit: str = ""
    scaling_efficiency: float | None = None
    pareto: bool = False
    recommended: bool = False

    @property
    def usable(self) -> bool:
        return (
            self.status in (OK, PREDICTED)
            and self.measurement is not None
            and (self.measurement.ok)
        )

    @property
    def estimator(self) -> str | None:
        return self.measurement.estimator if self.measurement else None

    def row(self) -> dict[str, Any]:
        p = self.placement
        per_gpu = self.throughput / p.gpus if self.throughput is not None else None
        return {
            "trial": self.name,
            "placement": p.describe(),
            "gpu_model": p.model,
            "gpus": p.gpus,
            "gpus_per_pod": p.gpus_per_pod,
            "pods": p.pods,
            "nodes": self.nodes_used,
            "layout": p.layout,
            "status": self.status,
            "estimator": self.estimator,
            "throughput": self.throughput,
            "unit": self.unit or None,
            "throughput_per_gpu": per_gpu,
            "scaling_efficiency": self.scaling_efficiency,
            "step_seconds": self.measurement.step_seconds if self.measurement else None,
            "peak_fb_mib": self.peak_fb_mib,
            "sm_active": self.sm_active,
            "gpu_seconds": self.gpu_seconds,
            "pareto": self.pareto,
            "recommended": self.recommended,
            "note": self.note or None,
        }


@dataclass
class Summary:
    results: list[TrialResult]
    estimator: str | None = None  # the one the comparison uses
    recommendation: str = ""
    pareto: list[TrialResult] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        return [result.row() for result in self.results]


def comparable(measurement: Measurement, gpus: int, scale: str) -> tuple[float, str]:
    """Work per second, and its unit (see the module docstring)."""
    assert measurement.rate is not None
    if measurement.step_seconds is None:
        return measurement.rate, measurement.unit
    if scale == WEAK:
        return measurement.rate * gpus, "per-GPU batches/s"
    return measurement.rate, "steps/s"


def summarise(
    results: Sequence[TrialResult], scale: str, good_enough: float = DEFAULT_GOOD_ENOUGH
) -> Summary:
    """Throughput, efficiency, the Pareto front of throughput against GPUs, and the
    recommendation: the fewest GPUs reaching ``good_enough`` of the best throughput."""
    listed = list(results)
    for result in listed:
        if result.usable:
            assert result.measurement is not None
            result.throughput, result.unit = comparable(
                result.measurement, result.placement.gpus, scale
            )
    usable = [r for r in listed if r.usable]
    if not usable:
        return Summary(listed, None, "no trial measured a throughput: nothing to recommend")
    estimator = min((r.estimator or "" for r in usable), key=ESTIMATORS.index)
    compared = [r for r in usable if r.estimator == estimator]
    _efficiency(compared)
    front = pareto_front(compared)
    for result in front:
        result.pareto = True
    best = max(compared, key=lambda r: r.throughput or 0.0)
    chosen = recommend(compared, good_enough)
    chosen.recommended = True
    return Summary(listed, estimator, _reason(chosen, best, estimator), front)


def _efficiency(results: Sequence[TrialResult]) -> None:
    by_model: dict[str | None, list[TrialResult]] = {}
    for result in results:
        by_model.setdefault(result.placement.model, []).append(result)
    for group in by_model.values():
        smallest = min(group, key=lambda r: (r.placement.gpus, -(r.throughput or 0.0)))
        base = (smallest.throughput or 0.0) / smallest.placement.gpus
        for result in group:
            per_gpu = (result.throughput or 0.0) / result.placement.gpus
            result.scaling_efficiency = per_gpu / base if base > 0 else None


def pareto_front(results: Sequence[TrialResult]) -> list[TrialResult]:
    """Trials no other beats on both: at most its GPUs and more throughput (or fewer GPUs and
    as much), fewest GPUs first."""
    front = []
    for result in results:
        gpus, value = result.placement.gpus, result.throughput or 0.0
        dominated = any(
            other.placement.gpus <= gpus
            and (other.throughput or 0.0) >= value
            and (other.placement.gpus < gpus or (other.throughput or 0.0) > value)
            for other in results
        )
        if not dominated:
            front.append(result)
    return sorted(front, key=lambda r: (r.placement.gpus, -(r.throughput or 0.0)))


def recommend(results: Sequence[TrialResult], good_enough: float) -> TrialResult:
    best = max(r.throughput or 0.0 for r in results)
    enough = [r for r in results if (r.throughput or 0.0) >= good_enough * best]
    return min(
        enough,
        key=lambda r: (
            r.placement.gpus,
            r.status != "ok",  # measured before predicted
            -(r.throughput or 0.0),
            r.placement.layout != PACKED,
        ),
    )


def _reason(chosen: TrialResult, best: TrialResult, estimator: str) -> str:
    placement = chosen.placement.describe()
    value = chosen.throughput or 0.0
    top = best.throughput or 0.0
    source = " (predicted by the step-time model)" if chosen.status == PREDICTED else ""
    proxy = "; by SM activity, a proxy for throughput" if estimator == "sm-proxy" else ""
    if chosen is best or value >= top:
        text = f"{placement}: the best throughput, {value:.3g} {chosen.unit}{source}{proxy}"
    else:
        ratio = best.placement.gpus / chosen.placement.gpus
        share = _fraction_words(ratio)
        text = (
            f"{placement}: {value / top:.0%} of the best throughput ({best.placement.describe()}"
            f") at {share} the GPUs{source}{proxy}"
        )
    if chosen.scaling_efficiency is not None and chosen.placement.gpus > 1:
        text += f"; scaling efficiency {chosen.scaling_efficiency:.0%}"
    return text


def _fraction_words(ratio: float) -> str:
    words = {2.0: "half", 4.0: "a quarter of", 3.0: "a third of", 8.0: "an eighth of"}
    return words.get(round(ratio, 6), f"1/{ratio:.3g} of")
