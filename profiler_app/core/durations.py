"""Prometheus-style durations ("90s", "30m", "1h30m") as seconds."""

import math
import re

from profiler_app.core.errors import UserError

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
# Longer than any window, interval, report range or retention means something; it also keeps
# "now minus the duration" far from datetime's year 1 and every float far from infinity.
MAX_DURATION_SECONDS = 100 * 365 * 86400.0
_HELP = "use a positive number with a unit, e.g. 30s, 30m, 1h30m"


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30m`` or ``1h30m``; a bare number means seconds.

    Positive, finite and at most 100 years, or ``UserError``.
    """
    cleaned = text.strip()
    try:
        seconds = float(cleaned)
    except ValueError:
        seconds = -1.0
        position = 0
        total = 0.0
        for match in _PART.finditer(cleaned):
            if match.start() != position:
                break
            total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            position = match.end()
        if cleaned and position == len(cleaned):
            seconds = total
    if not (seconds > 0 and math.isfinite(seconds)):
        raise UserError(f"malformed duration {text!r}: {_HELP}")
    if seconds > MAX_DURATION_SECONDS:
        raise UserError(f"duration {text!r} is longer than 100 years: {_HELP}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest readable form: 1800 -> '30m', 90 -> '1m30s', 3 days -> '3d'."""
    if not math.isfinite(seconds):
        return f"{seconds}s"
    remaining = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or f"{seconds:g}s"
