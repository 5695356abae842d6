"""What a workload needs of a GPU, from its measured peaks, and which GPU (or share of one) fits.

- **Memory**: peak framebuffer x (1 + headroom), 15 % by default.
- **Compute**: p95 SM activity x the SMs it has now. ``DCGM_FI_PROF_SM_ACTIVE`` is the fraction
  of cycles an SM has a warp, averaged over the device's SMs, so it times the SM count is how
  many SMs the work keeps busy. (GPU utilisation is a fraction of *time* that any kernel ran: a
  single small kernel reads 100 %, which says nothing about SMs.)
- **Memory bandwidth**: p95 ``DCGM_FI_PROF_DRAM_ACTIVE`` x the memory fraction it has now must fit
  the profile's memory fraction: a MIG instance gets the memory controllers of its memory slices.

Verdicts, in this order:

1. not enough history: less than 24 hours, or the workload's iteration cycle (training) or
   traffic peak (serving) not seen yet: no advice;
2. ``time-slicing candidate``: mostly idle or bursty work, which would leave any dedicated slice
   idle most of the time;
3. ``MIG <profile>``: the smallest profile of the GPU's model that holds memory, SMs and bandwidth,
   when one smaller than the whole GPU does;
4. ``MPS candidate``: steady low activity whose memory fits its share of a GPU shared by as many
   clients as its activity allows (no MIG profile fits, or the GPU has no MIG);
5. ``keep full GPU``.

All figures on a MIG instance (``DCGM_FI_PROF_*``) are relative to the instance; an SM activity
above 1 (seen on MIG, DCGM#152) counts as 1. Pure functions: the measurements come in, advice
comes out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum

from profiler_app.reports.rightsizing.defaults import DEFAULT_HEADROOM
from profiler_app.reports.rightsizing.profiles import GpuModel, MigProfile

MIN_HISTORY_SECONDS = 24 * 3600.0
# Mostly idle: active (above the idle threshold) at most this fraction of the time.
MOSTLY_IDLE_FRACTION = 0.3
# Steady: active at least this fraction of the time; low: p95 SM activity at most this.
STEADY_FRACTION = 0.8
LOW_SM_ACTIVE = 0.5
# Bursty: its p95 SM activity at least this many times its median activity.
BURST_RATIO = 4.0
# An MPS server serves at most 48 clients per GPU (MIG user guide, CUDA concurrency table).
MAX_MPS_CLIENTS = 48
MIB_PER_GIB = 1024.0


def one_decimal(value: float) -> str:
    """``value`` to one decimal, halves rounded up as people do (10.35 GiB -> "10.4")."""
    return str(Decimal(repr(value)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


class Verdict(StrEnum):
    NOT_ENOUGH_HISTORY = "not enough history"
    TIME_SLICING = "time-slicing candidate"
    MIG = "MIG"
    MPS = "MPS candidate"
    FULL_GPU = "keep full GPU"


@dataclass(frozen=True)
class WorkloadUsage:
    """What was measured of one workload on one kind of GPU, over ``history_seconds``.

    ``sm_active_p95``, ``sm_active_p50`` and ``dram_active_p95`` are DCGM's ratios (0..1) on the
    device the workload has now: the whole GPU (``current_profile`` None) or a MIG instance of
    ``current_profile``. ``active_fraction``: the fraction of time its activity was above the
    idle threshold. ``cycle_seen``: the classifier saw its iteration cycle (training) or a
    traffic peak that rose and fell inside the window (serving, see ``peak_inside``).
    """

    namespace: str
    workload: str
    gpu_model: str  # the product, as NVML or GFD names it
    peak_fb_mib: float
    sm_active_p95: float
    sm_active_p50: float
    dram_active_p95: float
    active_fraction: float
    history_seconds: float
    cycle_seen: bool
    current_profile: str | None = None


@dataclass(frozen=True)
class Needs:
    """What the workload needs of a device."""

    memory_gib: float
    sms: float
    memory_fraction: float  # of the whole GPU's bandwidth


@dataclass(frozen=True)
class Advice:
    """The verdict for one workload, its needs, and what they were checked against."""

    usage: WorkloadUsage
    verdict: Verdict
    reason: str
    needs: Needs | None = None
    profile: MigProfile | None = None  # the MIG verdict's profile
    smallest_fitting: MigProfile | None = None  # whatever the verdict, if a profile holds it
    mps_clients: int | None = None  # the MPS verdict's share: one of this many clients
    table_source: str = ""
    headroom: float = DEFAULT_HEADROOM
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """What the verdict recommends, in one word: a profile, ``time-slicing``, ``mps``,
        ``full-gpu``; empty without enough history."""
        return {
            Verdict.MIG: self.profile.name if self.profile else "",
            Verdict.TIME_SLICING: "time-slicing",
            Verdict.MPS: "mps",
            Verdict.FULL_GPU: "full-gpu",
            Verdict.NOT_ENOUGH_HISTORY: "",
        }[self.verdict]


def peak_inside(values: list[float], edge: int = 1) -> bool:
    """Whether the series' maximum lies inside it, ``edge`` samples or more from either end: a
    peak that rose and fell within the window, not one cut off at its start or end."""
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) < 2 * edge + 1:
        return False
    top = max(finite)
    inner = finite[edge:-edge] if edge else finite
    return max(inner) >= top and max(finite[:edge] + finite[-edge:]) < top


def enough_history(usage: WorkloadUsage) -> str | None:
    """Why there is not enough history for advice yet; None when there is."""
    hours = usage.history_seconds / 3600
    if usage.history_seconds < MIN_HISTORY_SECONDS:
        return f"{hours:.1f} h of history, advice needs at least 24 h"
    if not usage.cycle_seen:
        return "its iteration cycle or traffic peak has not been seen yet"
    return None


def _ratio(value: float) -> float:
    """A DCGM activity ratio as a fraction: clamped to [0, 1] (MIG can read above 1)."""
    return min(max(value, 0.0), 1.0) if not math.isnan(value) else 0.0


def needs_of(usage: WorkloadUsage, model: GpuModel | None, headroom: float) -> Needs:
    """Memory with headroom, SMs kept busy, and the share of the GPU's bandwidth used."""
    current = model.profile(usage.current_profile) if model and usage.current_profile else None
    if usage.current_profile and current is None:
        raise ValueError(
            f"{usage.namespace}/{usage.workload}: profile {usage.current_profile} is not one of "
            f"{model.key if model else usage.gpu_model}"
        )
    sms_now = current.sms if current else (model.sms if model else 0)
    fraction_now = current.memory_fraction if current else 1.0
    return Needs(
        memory_gib=usage.peak_fb_mib / MIB_PER_GIB * (1 + headroom),
        sms=_ratio(usage.sm_active_p95) * sms_now,
        memory_fraction=_ratio(usage.dram_active_p95) * fraction_now,
    )


def holds(profile: MigProfile, needs: Needs) -> bool:
    return (
        profile.memory_gib >= needs.memory_gib
        and profile.sms >= needs.sms
        and profile.memory_fraction >= needs.memory_fraction
    )


def smallest_fitting(model: GpuModel, needs: Needs) -> MigProfile | None:
    """The smallest profile of ``model`` that holds ``needs``; None when none does."""
    fitting = [profile for profile in model.profiles if holds(profile, needs)]
    return min(fitting, key=lambda p: p.size) if fitting else None


def _mostly_idle_or_bursty(usage: WorkloadUsage) -> str | None:
    if usage.active_fraction <= MOSTLY_IDLE_FRACTION:
        return f"active {usage.active_fraction:.0%} of the time"
    p50, p95 = _ratio(usage.sm_active_p50), _ratio(usage.sm_active_p95)
    if p95 > 0 and p95 >= BURST_RATIO * p50:
        return f"bursty: p95 SM activity {p95:.0%}, median {p50:.0%}"
    return None


def mps_clients(usage: WorkloadUsage, needs: Needs, gpu_memory_gib: float) -> int | None:
    """How many clients like this one an MPS-shared GPU could serve, if its activity is steady
    and low and its memory fits the share (1/clients of the GPU); None otherwise."""
    p95 = _ratio(usage.sm_active_p95)
    if usage.active_fraction < STEADY_FRACTION or not 0 < p95 <= LOW_SM_ACTIVE:
        return None
    # Compared before dividing: 1 / p95 overflows for a p95 near zero (a subnormal float).
    clients = MAX_MPS_CLIENTS if p95 * MAX_MPS_CLIENTS <= 1 else math.floor(1 / p95)
    if clients < 2 or needs.memory_gib > gpu_memory_gib / clients:
        return None
    return clients


def recommend(
    usage: WorkloadUsage,
    model: GpuModel | None,
    headroom: float = DEFAULT_HEADROOM,
    gpu_memory_gib: float | None = None,
) -> Advice:
    """The advice for one workload on a GPU of ``model`` (None: a GPU without MIG, whose memory
    ``gpu_memory_gib`` then says for the MPS share)."""
    if headroom < 0:
        raise ValueError(f"headroom must be at least 0, got {headroom}")
    notes = () if model is None or model.measured else (f"{model.key} table: {model.source}",)
    advice = Advice(
        usage=usage,
        verdict=Verdict.NOT_ENOUGH_HISTORY,
        reason="",
        table_source=model.source if model else "",
        headroom=headroom,
        notes=notes,
    )
    missing = enough_history(usage)
    if missing:
        return replace(advice, reason=missing)
    needs = needs_of(usage, model, headroom)
    fitting = smallest_fitting(model, needs) if model else None
    advice = replace(advice, needs=needs, smallest_fitting=fitting)
    idle = _mostly_idle_or_bursty(usage)
    if idle:
        return replace(advice, verdict=Verdict.TIME_SLICING, reason=idle)
    if model and fitting and fitting != model.whole_gpu_profile():
        reason = (
            f"needs {one_decimal(needs.memory_gib)} GiB, {one_decimal(needs.sms)} SMs and "
            f"{needs.memory_fraction:.0%} of the memory bandwidth; {fitting.name} has "
            f"{fitting.memory_gib:g} GiB, {fitting.sms} SMs and {fitting.memory_fraction:.0%}"
        )
        return replace(advice, verdict=Verdict.MIG, reason=reason, profile=fitting)
    memory = model.memory_gib if model else gpu_memory_gib
    clients = mps_clients(usage, needs, memory) if memory else None
    if clients and memory:
        reason = (
            f"steady, p95 SM activity {_ratio(usage.sm_active_p95):.0%}: one of {clients} "
            f"clients, {one_decimal(needs.memory_gib)} GiB of a "
            f"{one_decimal(memory / clients)} GiB share"
        )
        return replace(advice, verdict=Verdict.MPS, reason=reason, mps_clients=clients)
    if model is None:
        reason = "no MIG on this GPU, and its activity is too high or too uneven to share"
    elif fitting is None:
        reason = (
            f"no {model.key} MIG profile holds {one_decimal(needs.memory_gib)} GiB, "
            f"{one_decimal(needs.sms)} SMs "
            f"and {needs.memory_fraction:.0%} of the memory bandwidth"
        )
    else:
        reason = f"only the whole-GPU profile {fitting.name} holds it"
    return replace(advice, verdict=Verdict.FULL_GPU, reason=reason)
