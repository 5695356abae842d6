"""PromQL text: selectors with escaped values, and duration literals."""

from __future__ import annotations

import re

from profiler_app.core.errors import UserError
from profiler_app.core.model import GPU_UTIL

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def promql_selector(field: str, label: str, value: str) -> str:
    """``field{label="value"}`` with the value escaped as a PromQL string literal."""
    if not _METRIC_NAME.fullmatch(field):
        raise UserError(f"invalid metric name {field!r}: expected e.g. {GPU_UTIL}")
    if not _LABEL_NAME.fullmatch(label):
        raise UserError(f"invalid label name {label!r}: expected e.g. Hostname")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{field}{{{label}="{escaped}"}}'


def promql_duration(seconds: float) -> str:
    """A PromQL duration literal: whole seconds where possible, else milliseconds."""
    milliseconds = max(1, round(seconds * 1000))
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"
