"""Short machine-readable reasons for each verdict, e.g. ``period 80s in power``,
``sibling gpu 0 periodic``, ``util 100% at 13% of power range``, ``no pause in the loop``,
``owner PyTorchJob``, ``engine vllm``.

Reasons are plain strings made of words and numbers with their units, so they read well in a
table and can be matched by scripts. docs/analysis.md lists every form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from profiler_app.analysis.basis import Basis
from profiler_app.analysis.context import Context
from profiler_app.analysis.evidence import SignalLoops, Waiting
from profiler_app.analysis.iteration import Review
from profiler_app.analysis.stats import BoolArray, FloatArray, IntArray, Summary


def seconds_text(seconds: float) -> str:
    """80.4 -> "80s", 7.5 -> "7.5s"."""
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def _waiting_text(util: float, fraction: float, sm_active: float, peer: str) -> str:
    if math.isfinite(fraction):
        return f"util {util:.0f}% at {_percent(fraction)} of power range"
    if math.isfinite(sm_active):
        return f"util {util:.0f}% at sm-active {_percent(sm_active)}"
    return f"util {util:.0f}% while {peer} stalls"


def _half_text(first: float, second: float, step_seconds: float) -> str:
    """Why the halves of a window do not agree on its period."""
    if math.isfinite(first) and math.isfinite(second):
        return (
            f"period drifts: {seconds_text(first * step_seconds)}"
            f" then {seconds_text(second * step_seconds)}"
        )
    if math.isfinite(first) or math.isfinite(second):
        return f"period only in the {'first' if math.isfinite(first) else 'second'} half"
    return "no period in either half"


def _own_loops(review: Review, step_seconds: float) -> list[list[str]]:
    """Per row, its own loop and why it is not taken for training iterations (only the loop
    if it is; nothing for a row without a loop)."""
    drifts, pauses = review.drifts.tolist(), review.pauses.tolist()
    low, peak = review.low.tolist(), review.peak.tolist()
    first, second = review.halves.first.tolist(), review.halves.second.tolist()
    serving, strong = review.serving.tolist(), review.strong.tolist()
    seconds = (review.period * step_seconds).tolist()
    doubts: list[list[str]] = []
    for row, looped in enumerate(review.looped.tolist()):
        found: list[str] = []
        if looped:
            found.append(f"period {seconds_text(seconds[row])} in {review.signal[row]}")
            if drifts[row]:
                found.append(_half_text(first[row], second[row], step_seconds))
            if not pauses[row]:
                found.append("no pause in the loop")
            if low[row]:
                found.append(f"job peaks at util {peak[row]:.0f}%: not data-parallel ranks")
            if serving[row] and not strong[row]:
                found.append("loop in a serving workload")
        doubts.append(found)
    return doubts


def _workload_reasons(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def all_reasons(
    basis: IntArray,
    period_seconds: FloatArray,
    *,
    summary: Summary,
    loops: SignalLoops,
    waits: Waiting,
    review: Review,
    step_seconds: float,
    source: IntArray,
    context: Context,
    coupled_with: IntArray,
    guess: BoolArray,
) -> list[tuple[str, ...]]:
    """The reasons of every row, strongest evidence first; ``guess``: verdicts on a loop with no
    workload known."""
    idle_fraction = summary.idle_fraction.tolist()
    share = waits.share.tolist()
    evident = waits.evident.tolist()
    wait_util, wait_fraction, wait_sm = (
        np.nan_to_num(waits.util).tolist(),
        waits.power_fraction.tolist(),
        waits.sm_active.tolist(),
    )
    workload: Sequence[str | Sequence[str]] = context.prior_reasons or [""] * len(idle_fraction)
    peers, partners = waits.peer.tolist(), coupled_with.tolist()
    strong, serving = review.strong.tolist(), review.serving.tolist()
    own_loops = _own_loops(review, step_seconds)
    guesses = guess.tolist()
    reasons: list[tuple[str, ...]] = []
    for row, (code, seconds, origin) in enumerate(
        zip(basis.tolist(), period_seconds.tolist(), source.tolist(), strict=True)
    ):
        kind = Basis(code)
        found: list[str] = []
        idle_share = f"util idle {_percent(idle_fraction[row])} of samples"
        if kind is Basis.IDLE:
            found.append(idle_share)
        elif kind is Basis.UTIL_LOOP:
            found.append(f"period {seconds_text(seconds)} in util")
        elif kind is Basis.SIGNAL_LOOP:
            found += [f"period {seconds_text(seconds)} in {loops.signal[row]}", "no loop in util"]
        elif kind is Basis.SIBLING:
            state = "periodic" if math.isfinite(seconds) else "waiting"
            found.append(f"sibling {context.name(origin)} {state}")
        elif kind is Basis.CADENCE:
            found += own_loops[row]
        elif kind in (Basis.BURSTY, Basis.STEADY, Basis.PRIOR):
            found += [idle_share, *(own_loops[row] or ["no loop"])]
        if kind in (Basis.UTIL_LOOP, Basis.SIGNAL_LOOP) and serving[row] and strong[row]:
            found.append("loop and waiting ranks: training evidence")
        if kind is not Basis.IDLE and evident[row]:
            peer = context.name(peers[row]) if peers[row] >= 0 else "a peer"
            found.append(_waiting_text(wait_util[row], wait_fraction[row], wait_sm[row], peer))
            found.append(f"waiting {_percent(share[row])} of samples")
        if kind is not Basis.IDLE and partners[row] >= 0:
            found.append(f"stalls with {context.name(partners[row])}")
        if guesses[row]:
            found.append("no workload context")
        found += [reason for reason in _workload_reasons(workload[row]) if reason]
        reasons.append(tuple(found))
    return reasons
