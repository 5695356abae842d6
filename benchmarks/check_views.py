"""Every ``report`` view's figures for a sample of nodes, GPUs, pods and workloads, recomputed
from the raw rows with SQL of this module's own, and the largest difference per figure.

The raw rows are ``gpu_window`` (what each GPU did over each window, ``covers_seconds`` of wall
time ending at ``at``) and ``pod_usage`` (each pod's peaks and when it was seen). A row counts
for the part of its covered time inside the range; the peaks are those of every row that
overlaps the range. The report reads rollups for whole hours and days and raw rows only at
the range's edges, so agreement here checks the rollups, the edges and the output together.
The range must lie inside the raw rows' retention.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from profiler_app.reports.rightsizing import model_for

JOB_TYPES_SEEN = ("training", "inference", "idle", "bursty")
HELD_MEMORY_MIB = 1024.0  # a window's peak framebuffer at which memory counts as held
IDLE_BELOW_PERCENT = 5.0  # report --idle-below's default

Report = Callable[[str], list[dict[str, Any]]]  # the --by view's JSON rows


class Raw:
    """Independent SQL over the raw rows of ``[since, until]``."""

    def __init__(self, connection: sa.Connection, since: datetime, until: datetime) -> None:
        self.connection, self.since, self.until = connection, since, until
        postgres = connection.dialect.name == "postgresql"
        end = "extract(epoch FROM at)" if postgres else "(julianday(at) - 2440587.5) * 86400.0"
        low, high = since.timestamp(), until.timestamp()
        overlap = (
            f"(CASE WHEN {end} < {high} THEN {end} ELSE {high} END)"
            f" - (CASE WHEN {end} - covers_seconds > {low} THEN {end} - covers_seconds"
            f" ELSE {low} END)"
        )
        # A row's window ends inside [since, until + 1 h] (no row covers more than an hour).
        self.windows = (
            f"(SELECT *, {overlap} AS ov FROM gpu_window WHERE at >= :since AND at <= :reach)"
        )
        reach = datetime.fromtimestamp(high + 3600, tz=UTC)
        self.bind: dict[str, Any] = {"since": since, "reach": reach}
        if not postgres:  # SQLite keeps naive UTC text
            self.bind = {key: f"{value:%Y-%m-%d %H:%M:%S}" for key, value in self.bind.items()}

    def rows(self, sql: str, **bind: Any) -> list[Any]:
        return list(self.connection.execute(sa.text(sql), self.bind | bind))

    def gpus(self, nodes: list[str]) -> dict[tuple[str, str, str], dict[str, float]]:
        """Per GPU of ``nodes``: hours per job type, idle hours, peaks."""
        marks = ", ".join(f":n{i}" for i in range(len(nodes)))
        figures: dict[tuple[str, str, str], dict[str, float]] = {}
        for node, gpu, instance, job_type, seconds, idle, util, copy, fb in self.rows(
            "SELECT node, gpu, gpu_i_id, job_type, sum(ov),"
            " sum(ov * coalesce(util_idle_fraction, 0)), max(util_max),"
            f" max(mem_copy_util_max), max(fb_used_max_mib) FROM {self.windows} w"
            f" WHERE ov > 0 AND node IN ({marks}) GROUP BY node, gpu, gpu_i_id, job_type",
            **{f"n{i}": node for i, node in enumerate(nodes)},
        ):
            gpu_figures = figures.setdefault((node, gpu, instance or ""), {})
            gpu_figures[f"{job_type}_hours"] = seconds / 3600
            gpu_figures["covered_hours"] = gpu_figures.get("covered_hours", 0.0) + seconds / 3600
            gpu_figures["idle_gpu_hours"] = gpu_figures.get("idle_gpu_hours", 0.0) + idle / 3600
            for name, value in (
                ("util_max_percent", util),
                ("mem_copy_util_max_percent", copy),
                ("fb_used_max_mib", fb),
            ):
                if value is not None:
                    gpu_figures[name] = max(gpu_figures.get(name, value), value)
        return figures

    def waste(self, workloads: list[tuple[str, str]]) -> dict[tuple[Any, ...], dict[str, float]]:
        """Per waste kind and sampled (namespace, workload), and for GPUs without a pod: idle
        GPU-hours and the GPUs that added to them."""
        kind = (
            f"CASE WHEN fb_used_max_mib >= {HELD_MEMORY_MIB} THEN 'memory-held-compute-idle'"
            " WHEN pod IS NOT NULL THEN 'allocated-idle' ELSE 'idle-no-pod' END"
        )
        chosen = " OR ".join(
            f"(namespace = :s{i} AND owner_name = :w{i})" for i in range(len(workloads))
        )
        bind = {f"s{i}": namespace for i, (namespace, _) in enumerate(workloads)}
        bind |= {f"w{i}": workload for i, (_, workload) in enumerate(workloads)}
        figures: dict[tuple[Any, ...], dict[str, float]] = {}
        for kind_name, namespace, owner, gpus, idle in self.rows(
            f"SELECT kind, namespace, owner_name, count(*), sum(idle) FROM (SELECT {kind} AS kind,"
            " namespace, owner_name, sum(ov * coalesce(util_idle_fraction, 0)) AS idle"
            f" FROM {self.windows} w WHERE ov > 0 AND (pod IS NULL OR {chosen})"
            " GROUP BY 1, namespace, owner_name, node, uuid, gpu_i_id) g WHERE idle > 0"
            " GROUP BY kind, namespace, owner_name",
            **bind,
        ):
            figures[kind_name, namespace, owner] = {"gpus": gpus, "idle_gpu_hours": idle / 3600}
        return figures

    def pods(self, nodes: list[str]) -> dict[tuple[str, str, str], dict[str, float]]:
        """Per pod seen on ``nodes`` in the range: GPU-hours (GPUs held x hours seen) and peaks."""
        marks = ", ".join(f":n{i}" for i in range(len(nodes)))
        figures = {}
        for row in self.rows(
            "SELECT namespace, pod, node, gpu_count, first_seen, last_seen, gpu_util_max,"
            " fb_used_max_mib FROM pod_usage WHERE gpu_count > 0"
            f" AND node IN ({marks})",
            **{f"n{i}": node for i, node in enumerate(nodes)},
        ):
            first, last = _instant(row.first_seen), _instant(row.last_seen)
            seen = min(last, self.until.timestamp()) - max(first, self.since.timestamp())
            if last < self.since.timestamp() or first > self.until.timestamp():
                continue
            figures[row.namespace, row.pod, row.node] = {
                "gpu_hours": max(seen, 0.0) / 3600 * row.gpu_count,
                "gpu_util_max_percent": row.gpu_util_max,
                "fb_used_max_mib": row.fb_used_max_mib,
            }
        return figures

    def sm_p95(self, workloads: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """Each workload's covered-time-weighted p95 of its windows' SM activity p95s."""
        values: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for namespace, workload, sm, ov in self.rows(
            "SELECT namespace, coalesce(owner_name, pod), sm_active_p95, ov"
            f" FROM {self.windows} w WHERE ov > 0 AND sm_active_p95 IS NOT NULL AND ("
            + " OR ".join(
                f"(namespace = :s{i} AND coalesce(owner_name, pod) = :w{i})"
                for i in range(len(workloads))
            )
            + ")",
            **{f"s{i}": namespace for i, (namespace, _) in enumerate(workloads)},
            **{f"w{i}": workload for i, (_, workload) in enumerate(workloads)},
        ):
            values.setdefault((namespace, workload), []).append((sm, ov))
        result = {}
        for key, pairs in values.items():
            pairs.sort()
            target, cumulative = 0.95 * sum(weight for _, weight in pairs), 0.0
            result[key] = pairs[-1][0]
            for value, weight in pairs:
                cumulative += weight
                if cumulative >= target:
                    result[key] = value
                    break
        return result


def _instant(value: Any) -> float:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


class Differences:
    """The largest absolute difference per figure, and how many figures were compared."""

    def __init__(self) -> None:
        self.largest: dict[str, float] = {}
        self.compared: dict[str, int] = {}

    def add(self, view: str, figure: str, reported: Any, expected: Any) -> None:
        name = f"{view} {figure}"
        self.compared[name] = self.compared.get(name, 0) + 1
        if reported is None or expected is None:
            difference = 0.0 if reported is None and expected is None else float("inf")
        else:
            difference = abs(float(reported) - float(expected))
        self.largest[name] = max(self.largest.get(name, 0.0), difference)

    def missing(self, view: str, what: str) -> None:
        self.largest[f"{view} missing {what}"] = float("inf")


def check(
    connection: sa.Connection, report: Report, since: datetime, until: datetime, sample: int
) -> Differences:
    """Compare every view's rows for ``sample`` nodes (and their GPUs and pods) and ``sample``
    workloads with ``Raw``'s figures."""
    raw, differences, rng = Raw(connection, since, until), Differences(), random.Random(7)
    gpu_rows = report("gpu")
    nodes = sorted(rng.sample(sorted({row["node"] for row in gpu_rows}), sample))
    expected_gpus = raw.gpus(nodes)
    _compare_gpus(differences, gpu_rows, expected_gpus)
    _compare_nodes(differences, report("node"), nodes, expected_gpus)
    waste_rows = report("waste")
    workloads = sorted(
        rng.sample(
            sorted(
                {(row["namespace"], row["owner_name"]) for row in waste_rows if row["owner_name"]}
            ),
            sample,
        )
    )
    expected = raw.waste(workloads)
    for row in waste_rows:
        key = (row["kind"], row["namespace"], row["owner_name"])
        if row["owner_name"] is None or (row["namespace"], row["owner_name"]) in workloads:
            figures = expected.pop(key, None)
            if figures is None:
                differences.missing("waste", "in the raw rows")
                continue
            differences.add("waste", "idle hours", row["idle_gpu_hours"], figures["idle_gpu_hours"])
            differences.add("waste", "GPUs", row["gpus"], figures["gpus"])
    if expected:
        differences.missing("waste", "in the report")
    _compare_pods(differences, report, raw.pods(nodes), nodes)
    # Right-sizing advises only workloads with a day of history: sampled among those.
    rightsize_rows = report("rightsize")
    advised = sorted(
        {(row["namespace"], row["workload"]) for row in rightsize_rows if row["needs"]}
    )
    advised = sorted(rng.sample(advised, min(sample, len(advised))))
    _compare_rightsize(differences, rightsize_rows, raw.sm_p95(advised) if advised else {})
    for view in ("trace", "trial"):  # listed rows, no figure summed from raw rows
        differences.compared[f"{view} rows listed"] = len(report(view))
    return differences


def _compare_gpus(
    differences: Differences,
    rows: Iterable[dict[str, Any]],
    expected: dict[tuple[str, str, str], dict[str, float]],
) -> None:
    remaining = dict(expected)
    for row in rows:
        figures = remaining.pop((row["node"], row["gpu"], row["mig_instance"] or ""), None)
        if figures is None:
            continue
        for figure in (
            "covered_hours",
            *(f"{job_type}_hours" for job_type in JOB_TYPES_SEEN),
            "idle_gpu_hours",
            "util_max_percent",
            "mem_copy_util_max_percent",
            "fb_used_max_mib",
        ):
            differences.add("gpu", figure, row[figure], figures.get(figure, 0.0))
    if remaining:
        differences.missing("gpu", "in the report")


def _compare_nodes(
    differences: Differences,
    rows: Iterable[dict[str, Any]],
    nodes: list[str],
    gpus: dict[tuple[str, str, str], dict[str, float]],
) -> None:
    for row in rows:
        if row["node"] not in nodes:
            continue
        mine = [figures for key, figures in gpus.items() if key[0] == row["node"]]
        differences.add("node", "GPUs", row["gpus"], len(mine))
        for figure in ("covered_hours", "idle_gpu_hours", "training_hours", "idle_hours"):
            differences.add("node", figure, row[figure], sum(gpu.get(figure, 0.0) for gpu in mine))
        differences.add(
            "node",
            "util_max_percent",
            row["util_max_percent"],
            max(gpu["util_max_percent"] for gpu in mine),
        )


def _compare_pods(
    differences: Differences,
    report: Report,
    expected: dict[tuple[str, str, str], dict[str, float]],
    nodes: list[str],
) -> None:
    for view in ("pod", "idle-pods"):
        wanted = {
            key: figures
            for key, figures in expected.items()
            if view == "pod"
            or (
                figures["gpu_util_max_percent"] is not None
                and figures["gpu_util_max_percent"] <= IDLE_BELOW_PERCENT
            )
        }
        for row in report(view):
            if row["node"] not in nodes:
                continue
            figures = wanted.pop((row["namespace"], row["pod"], row["node"]), None)
            if figures is None:
                differences.missing(view, "in the raw rows")
                continue
            for figure, value in figures.items():
                differences.add(view, figure, row[figure], value)
        if wanted:
            differences.missing(view, f"in the report ({len(wanted)})")


def _compare_rightsize(
    differences: Differences, rows: Iterable[dict[str, Any]], p95: dict[tuple[str, str], float]
) -> None:
    for row in rows:
        expected = p95.get((row["namespace"], row["workload"]))
        if expected is None or not row.get("needs"):
            continue
        model = model_for(row["gpu_model"])
        if model is None:
            continue
        profile = model.profile(row["current_profile"]) if row["current_profile"] else None
        sms = row["needs"]["sms"] / (profile.sms if profile else model.sms)
        differences.add("rightsize", "SM p95 (bound: one 1 % bucket)", sms, min(expected, 1.0))
