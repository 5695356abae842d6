"""Prometheus-style durations ("90s", "30m", "1h30m") as seconds."""

import re

from profiler_app.errors import UserError

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``30m`` or ``1h30m``; a bare number means seconds."""
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
    if not seconds > 0:
        raise UserError(
            f"malformed duration {text!r}: use a positive number with a unit, e.g. 30s, 30m, 1h30m"
        )
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest readable form: 1800 -> '30m', 90 -> '1m30s'."""
    remaining = round(seconds)
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or f"{seconds:g}s"
