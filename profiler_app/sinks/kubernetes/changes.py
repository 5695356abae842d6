"""Which differences between the annotations written and the ones wanted are worth a request.

Numbers count as changed only when they move beyond a tolerance (``TOLERANCES``) from the value
last written, so a period estimate wobbling as the window slides costs nothing while slow drift
is still written once it adds up. A patch sent anyway carries every value that differs at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from profiler_app.core.model import IO_FIELDS
from profiler_app.sinks.kubernetes.names import (
    CONFIDENCE,
    FB_USED_MAX,
    MEM_COPY_UTIL_MAX,
    PERIOD,
    POD_CPU_UTIL_MAX,
    POD_GPU_MEM_COPY_UTIL_MAX,
    POD_GPU_UTIL_MAX,
    POD_MEM_USED_MAX,
    REASONS,
    UTIL_MAX,
    pod_io_name,
)

Patch = dict[str, str | None]


@dataclass(frozen=True)
class Tolerance:
    """How far a number may move from the value last written before it counts as a change."""

    absolute: float = 0.0
    relative: float = 0.0  # fraction of the value last written

    def exceeded(self, written: float, current: float) -> bool:
        return abs(current - written) > max(self.absolute, self.relative * abs(written))


_PERCENT = Tolerance(absolute=1.0)  # 1 point: 99 <-> 100 is noise, 97 -> 99 is news
_MIB = Tolerance(absolute=64.0, relative=0.01)
# Keyed by annotation name (after the domain and, on nodes, the gpu-<i>- prefix); see
# docs/annotations.md. Names not listed (job-type, profiled-at) change on any difference.
TOLERANCES: dict[str, Tolerance] = {
    PERIOD: Tolerance(relative=0.02),
    CONFIDENCE: Tolerance(absolute=0.05),
    UTIL_MAX: _PERCENT,
    MEM_COPY_UTIL_MAX: _PERCENT,
    FB_USED_MAX: _MIB,
    POD_GPU_UTIL_MAX: _PERCENT,
    POD_GPU_MEM_COPY_UTIL_MAX: _PERCENT,
    POD_CPU_UTIL_MAX: Tolerance(absolute=1.0, relative=0.02),  # percent of one core, may be > 100
    POD_MEM_USED_MAX: _MIB,
    # Rates swing from second to second: 1 MiB/s or 10 % of the value written.
    **{
        pod_io_name(direction, statistic): Tolerance(absolute=1.0, relative=0.1)
        for direction in IO_FIELDS
        for statistic in ("max", "p95")
    },
}

_NUMBER = re.compile(r"\d+(\.\d+)?")
_NODE_GPU_KEY_NAME = re.compile(r"^gpu-[A-Za-z0-9]+-(?:mig-[0-9]+-)?(.+)$")


def diff(known: Mapping[str, str], desired: Mapping[str, str], owned: Iterable[str]) -> Patch:
    """Patch turning ``known`` into ``desired``: changed values, and null for owned keys gone."""
    patch: Patch = {key: value for key, value in desired.items() if known.get(key) != value}
    patch.update({key: None for key in owned if key in known and key not in desired})
    return patch


def _tolerance(key: str) -> Tolerance | None:
    name = key.rpartition("/")[2]
    if name in TOLERANCES:  # a pod key, or a node key whose GPU index looks like one
        return TOLERANCES[name]
    node_key = _NODE_GPU_KEY_NAME.match(name)
    return TOLERANCES.get(node_key.group(1)) if node_key else None


def significant(key: str, written: str | None, current: str | None) -> bool:
    """Whether ``key`` going from ``written`` to ``current`` is worth a request.

    Appearing and disappearing always are; numbers only beyond the key's tolerance.
    """
    if written == current:
        return False
    if written is not None and current is not None and key.endswith(f"-{REASONS}"):
        # The numbers in reasons move a little every cycle; new evidence changes the words.
        return _NUMBER.sub("#", written) != _NUMBER.sub("#", current)
    tolerance = _tolerance(key)
    if tolerance is None or written is None or current is None:
        return True
    try:
        return tolerance.exceeded(float(written), float(current))
    except ValueError:
        return True


def significant_patch(known: Mapping[str, str], patch: Patch) -> bool:
    return any(significant(key, known.get(key), value) for key, value in patch.items())
