"""Short machine-readable reasons for each verdict, e.g. ``period 80s in power``,
``sibling gpu 0 periodic``, ``util 100% at 13% of power range``, ``owner PyTorchJob``.

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
from profiler_app.analysis.stats import FloatArray, IntArray, Summary


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


def all_reasons(
    basis: IntArray,
    period_seconds: FloatArray,
    *,
    summary: Summary,
    loops: SignalLoops,
    waits: Waiting,
    source: IntArray,
    context: Context,
    coupled_with: IntArray,
) -> list[tuple[str, ...]]:
    """The reasons of every row, strongest evidence first."""
    idle_fraction = summary.idle_fraction.tolist()
    share = waits.share.tolist()
    evident = waits.evident.tolist()
    wait_util, wait_fraction, wait_sm = (
        np.nan_to_num(waits.util).tolist(),
        waits.power_fraction.tolist(),
        waits.sm_active.tolist(),
    )
    prior_reasons: Sequence[str] = context.prior_reasons or [""] * len(idle_fraction)
    peers, partners = waits.peer.tolist(), coupled_with.tolist()
    reasons: list[tuple[str, ...]] = []
    for row, (code, seconds, origin) in enumerate(
        zip(basis.tolist(), period_seconds.tolist(), source.tolist(), strict=True)
    ):
        kind = Basis(code)
        found: list[str] = []
        if kind is Basis.IDLE:
            found.append(f"util idle {_percent(idle_fraction[row])} of samples")
        elif kind is Basis.UTIL_LOOP:
            found.append(f"period {seconds_text(seconds)} in util")
        elif kind is Basis.SIGNAL_LOOP:
            found += [f"period {seconds_text(seconds)} in {loops.signal[row]}", "no loop in util"]
        elif kind is Basis.SIBLING:
            state = "periodic" if math.isfinite(seconds) else "waiting"
            found.append(f"sibling {context.name(origin)} {state}")
        elif kind in (Basis.BURSTY, Basis.STEADY, Basis.PRIOR):
            found += [f"util idle {_percent(idle_fraction[row])} of samples", "no loop"]
        if kind is not Basis.IDLE and evident[row]:
            peer = context.name(peers[row]) if peers[row] >= 0 else "a peer"
            found.append(_waiting_text(wait_util[row], wait_fraction[row], wait_sm[row], peer))
            found.append(f"waiting {_percent(share[row])} of samples")
        if kind is not Basis.IDLE and partners[row] >= 0:
            found.append(f"stalls with {context.name(partners[row])}")
        if prior_reasons[row]:
            found.append(prior_reasons[row])
        reasons.append(tuple(found))
    return reasons
