"""Right-sizing advice as rows: for a terminal table, JSON, CSV, and a Prometheus metric.

Pure functions; the command and the metrics sink do the writing. Figures are rounded for people
(memory to 0.1 GiB, SMs to 0.1, bandwidth to whole percent); JSON keeps them unrounded.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from profiler_app.reports.rightsizing.advice import Advice, one_decimal

# RIGHTSIZE_METRIC's help and labels (the name is in ``defaults``, for ``report --help``).
RIGHTSIZE_HELP = (
    "Right-sizing advice from measured peaks (1 for the recommended profile): a MIG profile, "
    "time-slicing, mps or full-gpu; advice only, nothing is applied"
)
RIGHTSIZE_LABELS = ("namespace", "workload", "profile")
COLUMNS = (
    "NAMESPACE",
    "WORKLOAD",
    "GPU",
    "VERDICT",
    "RECOMMENDS",
    "MEMORY GiB",
    "SMs",
    "BANDWIDTH",
    "SMALLEST MIG",
    "REASON",
)


def advice_record(advice: Advice) -> dict[str, Any]:
    """One workload's advice as a JSON object (unrounded figures)."""
    needs = advice.needs
    return {
        "namespace": advice.usage.namespace,
        "workload": advice.usage.workload,
        "gpu_model": advice.usage.gpu_model,
        "current_profile": advice.usage.current_profile,
        "verdict": advice.verdict.value,
        "recommends": advice.label or None,
        "reason": advice.reason,
        "needs": None
        if needs is None
        else {
            "memory_gib": needs.memory_gib,
            "sms": needs.sms,
            "memory_bandwidth_fraction": needs.memory_fraction,
        },
        "smallest_fitting_profile": advice.smallest_fitting.name
        if advice.smallest_fitting
        else None,
        "mps_clients": advice.mps_clients,
        "headroom": advice.headroom,
        "history_hours": advice.usage.history_seconds / 3600,
        "table_source": advice.table_source or None,
        "notes": list(advice.notes),
    }


def table_rows(advices: Iterable[Advice]) -> list[tuple[str, ...]]:
    """Rows under ``COLUMNS`` for a terminal table; "-" where a figure does not apply."""
    rows: list[tuple[str, ...]] = []
    for advice in advices:
        needs = advice.needs
        rows.append(
            (
                advice.usage.namespace,
                advice.usage.workload,
                advice.usage.gpu_model,
                advice.verdict.value,
                advice.label or "-",
                one_decimal(needs.memory_gib) if needs else "-",
                one_decimal(needs.sms) if needs else "-",
                f"{needs.memory_fraction:.0%}" if needs else "-",
                advice.smallest_fitting.name if advice.smallest_fitting else "-",
                advice.reason,
            )
        )
    return rows


def csv_text(advices: Iterable[Advice]) -> str:
    """The table's rows as CSV, with a header line."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([column.lower().replace(" ", "_") for column in COLUMNS])
    writer.writerows(table_rows(advices))
    return buffer.getvalue()


def metric_samples(advices: Iterable[Advice]) -> list[tuple[dict[str, str], float]]:
    """Samples of ``RIGHTSIZE_METRIC``: (labels, 1.0) per workload with advice."""
    return [
        (
            {
                "namespace": advice.usage.namespace,
                "workload": advice.usage.workload,
                "profile": advice.label,
            },
            1.0,
        )
        for advice in advices
        if advice.label
    ]
