"""``TableStore``: the sink that writes each cycle to the store in one transaction."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from profiler_app.core.errors import UserError
from profiler_app.core.model import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    MEM_COPY_UTIL,
    SM_ACTIVE,
    CycleResult,
    GpuProfile,
    PodUsage,
)
from profiler_app.sinks import field_stat
from profiler_app.sinks.store.activity import ACTIVITY_TIERS, activity_rows, activity_statement
from profiler_app.sinks.store.dbapi import Database, UnknownSchemaError, describe_driver_error
from profiler_app.sinks.store.idle_blocks import IdleBlocks, forget, late_days
from profiler_app.sinks.store.migrate import MigrationFailedError, migrate_here, migrate_in_child
from profiler_app.sinks.store.packing import Packing
from profiler_app.sinks.store.partitions import SCHEMES, PartitionKeeper
from profiler_app.sinks.store.retention import Retention
from profiler_app.sinks.store.rollups import (
    GPU_TIERS,
    POD_HOUR,
    gpu_rollup_rows,
    pod_rollup_rows,
    rollup_statement,
)
from profiler_app.sinks.store.schema import (
    IO_DIRECTIONS,
    IO_STATISTICS,
    POD_IO_COLUMNS,
    REASONS_LENGTH,
    UNKNOWN_START_TIME,
    io_column,
)
from profiler_app.sinks.store.settling import Settling
from profiler_app.sinks.store.statements import Merge, insert_statement, merged, upsert_statement
from profiler_app.sinks.store.urls import parse_store_url

log = logging.getLogger(__name__)

# Column names as in models.py (the one definition of the tables; the store tests run these
# statements against the migrated schema on SQLite and PostgreSQL).
_PEAK_COLUMNS = (
    "gpu_util_max",
    "gpu_mem_copy_util_max",
    "fb_used_max_mib",
    "cpu_util_max",
    "mem_used_max_bytes",
    *POD_IO_COLUMNS,  # the 95th percentiles too: the largest of the windows written
)
_POD_KEY = ("namespace", "pod", "node", "pod_start_time")


class StoreError(Exception):
    """Writing to the store failed (e.g. PostgreSQL is down); the next cycle tries again."""


class TableStore:
    """Sink writing per-GPU window rows and per-pod peaks; migrates the schema on start."""

    name = "store"

    def __init__(
        self,
        url: str,
        *,
        retention_seconds: float | None = None,
        rollup_retention_seconds: float | None = None,
        store_interval_seconds: float = 0.0,
        migrate_in_child: bool = False,
    ) -> None:
        """``retention_seconds``: how long raw rows stay, ``rollup_retention_seconds`` the
        rollups and pods (None: for ever). ``store_interval_seconds``: write a cycle only when
        it starts a new slot of this length (0: every cycle); the skipped cycles' time is
        covered by the next row written. ``migrate_in_child``: the daemon's choice, to keep
        Alembic and SQLAlchemy out of its memory."""
        parsed = parse_store_url(url)
        self.url = parsed.display()
        self._url = url  # with its password: only for the migration process's environment
        self._migrate_in_child = migrate_in_child
        self._database = Database(parsed)
        self._retention = (
            Retention(retention_seconds, rollup_retention_seconds)
            if retention_seconds or rollup_retention_seconds
            else None
        )
        self._packing = Packing()  # the histograms of complete buckets (packing.py)
        self._settling = Settling()  # gpu_job_day's complete days from gpu_day (settling.py)
        self._idle_blocks = IdleBlocks()  # waste's blocks of settled days (idle_blocks.py)
        self._store_interval = store_interval_seconds
        self._partitions = PartitionKeeper() if parsed.backend == "postgresql" else None
        # Per node: this process's last committed cycle, and the latest one not written yet.
        self._written_at: dict[str, datetime] = {}
        self._pending: dict[str, CycleResult] = {}
        # The oldest cycle of each node whose write failed: written first on the next try, so a
        # full disk or an outage loses no cycle's row once it is over.
        self._unwritten: dict[str, CycleResult] = {}
        self._statements: dict[tuple[Any, ...], str] = {}
        self._migrated = False
        try:
            self._migrate()
        except StoreError as error:
            if parsed.sqlite_path() is not None:
                raise UserError(str(error)) from None
            # PostgreSQL may come up after the daemon; publish retries the migration.
            log.warning("%s; will retry on the next cycle", error)

    def publish(self, result: CycleResult) -> None:
        failed = self._unwritten.get(result.node)
        if failed is not None:  # if it fails again, this cycle waits too: a later row covers it
            self._write(failed, retry=True, now=result.at)
            self._unwritten.pop(result.node, None)
        if not self._due(result):
            self._pending[result.node] = result
            return
        try:
            self._write(result)
        except StoreError:
            self._unwritten.setdefault(result.node, result)
            raise

    def close(self) -> None:
        """Writes the latest cycle not yet written (``store_interval_seconds``), so that a
        daemon replaced between two writes leaves no gap, then closes the connection."""
        pending = [*self._unwritten.values(), *self._pending.values()]
        self._pending, self._unwritten = {}, {}
        try:
            for result in pending:
                self._write(result, now=max(cycle.at for cycle in pending))
        except (StoreError, UserError) as error:
            log.warning("the last cycle was not written: %s", error)
        finally:
            self._database.close()

    def _due(self, result: CycleResult) -> bool:
        """Whether a cycle is written: every cycle, or its node's first of each slot of
        ``store_interval_seconds`` (slots on a fixed grid, so rows land on round times)."""
        written = self._written_at.get(result.node)
        if self._store_interval <= 0 or written is None:
            return True
        slot = self._store_interval
        return math.floor(result.at.timestamp() / slot) != math.floor(written.timestamp() / slot)

    def _write(
        self, result: CycleResult, *, retry: bool = False, now: datetime | None = None
    ) -> None:
        """Writes ``result``; ``now``: the newest cycle's time (a retried one is older)."""
        if not self._migrated:
            self._migrate()
        database = self._database
        try:
            if self._partitions is not None:
                self._partitions.ensure(database, _partitions_needed(result))
            with database.transaction() as cursor:
                last_at = self._load_last_at(cursor, result)
                # Retrying a failed cycle: a GPU whose row is in already (the commit went
                # through, its answer was lost) gets none again.
                rows = [
                    _gpu_window_row(result, profile, last_at.get(_gpu_identity(profile)))
                    for profile in result.gpus
                    if not (retry and _written(last_at.get(_gpu_identity(profile)), result.at))
                ]
                self._insert_gpu_windows(cursor, rows)
                self._upsert_rollups(cursor, rows, result.pods)
                self._upsert_pods(cursor, result.pods, result.at)
                self._forget_late_blocks(cursor, rows, result.at, now or result.at)
        except database.errors as error:
            if self._partitions is not None:
                self._partitions.forget()
            raise StoreError(f"store {self.url}: {describe_driver_error(error)}") from error
        self._written_at[result.node] = result.at
        self._pending.pop(result.node, None)
        if self._retention is not None and self._retention.due():
            self._maintain("retention", self._retention.prune, result.at)
        if self._packing.due():
            self._maintain("packing", self._packing.pack, result.at)
        if self._settling.due():
            self._maintain("settling", self._settling.settle, result.at)
        if self._idle_blocks.due():
            self._maintain("idle blocks", self._idle_blocks.make, result.at)

    def _maintain(
        self, what: str, step: Callable[[Database, datetime], int], now: datetime
    ) -> None:
        # The cycle's rows are committed: a failed clean-up is retried, not a failed cycle.
        try:
            step(self._database, now)
        except self._database.errors as error:
            log.warning(
                "store %s: %s failed, retrying next cycle: %s",
                self.url,
                what,
                describe_driver_error(error),
            )

    def _migrate(self) -> None:
        try:
            if self._migrate_in_child:
                migrate_in_child(self._database, self._url)
            else:
                migrate_here(self._database.url)
        except UnknownSchemaError as error:
            raise UserError(
                f"store {self.url} has a schema this gpu-profiler does not know ({error}); "
                "upgrade gpu-profiler"
            ) from None
        except self._database.errors as error:
            raise StoreError(f"store {self.url}: {describe_driver_error(error)}") from error
        except MigrationFailedError as error:
            raise StoreError(f"store {self.url}: migration failed: {error}") from None
        self._migrated = True

    def _load_last_at(
        self, cursor: Any, result: CycleResult
    ) -> dict[tuple[str, str, str], datetime]:
        """Each GPU's last row time within the window, read in the cycle's transaction: the
        store, not this process, knows what was committed (a commit whose answer was lost,
        another process writing the same node during a rolling update). One lookup per GPU on
        the (node, gpu, at) index: at most a window of rows, however large the table; all in
        one statement, one round trip through a pooler."""
        if not result.gpus:
            return {}
        param = self._database.param  # placeholders, not values
        gpus = ", ".join(
            f"({param(f'gpu{index}')}, {param(f'uuid{index}')}, {param(f'instance{index}')})"
            for index in range(len(result.gpus))
        )
        statement = (
            f"WITH gpus (gpu, uuid, gpu_i_id) AS (VALUES {gpus})"  # noqa: S608
            " SELECT gpus.gpu, gpus.uuid, gpus.gpu_i_id, (SELECT max(at) FROM gpu_window"
            f" WHERE node = {param('node')} AND gpu = gpus.gpu AND uuid = gpus.uuid"
            f" AND gpu_i_id = gpus.gpu_i_id AND at > {param('since')}) FROM gpus"
        )
        values: dict[str, Any] = {
            "node": result.node,
            "since": result.at - timedelta(seconds=result.window_seconds),
        }
        for index, profile in enumerate(result.gpus):
            values[f"gpu{index}"], values[f"uuid{index}"] = profile.gpu, profile.uuid
            values[f"instance{index}"] = profile.mig_instance
        cursor.execute(statement, self._database.bind(values))
        return {
            (gpu, uuid, instance): self._database.read_time(at)
            for gpu, uuid, instance, at in cursor.fetchall()
            if at is not None
        }

    def _statement(self, build: Callable[..., str], table: Any, columns: Iterable[str]) -> str:
        """``build(database, table, columns)``, made once per table and column set."""
        key = (build, table, tuple(columns))
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = build(self._database, table, key[2])
        return statement

    def _forget_late_blocks(
        self, cursor: Any, rows: list[dict[str, Any]], at: datetime, now: datetime
    ) -> None:
        """Drops the idle blocks holding days this cycle's rows reach back into (a long window,
        or a cycle retried after an outage): the blocks are made again from gpu_day
        (idle_blocks.py)."""
        if not rows:
            return
        earliest = at - timedelta(seconds=max(row["covers_seconds"] for row in rows))
        late = late_days(earliest, at, max(at, now))
        if late is not None:
            dropped = forget(self._database, cursor, *late)
            if dropped:
                log.info("store: a late cycle dropped %d idle block(s) to be made again", dropped)

    def _insert_gpu_windows(self, cursor: Any, rows: list[dict[str, Any]]) -> None:
        if rows:
            cursor.executemany(
                self._statement(insert_statement, "gpu_window", rows[0]),
                [self._database.bind(row) for row in rows],
            )

    def _upsert_rollups(
        self, cursor: Any, rows: list[dict[str, Any]], pods: list[PodUsage]
    ) -> None:
        """The cycle's rows added into the hour and day they cover (rollups.py, and
        right-sizing's in activity.py)."""
        for tier, upserts in (
            *((tier, gpu_rollup_rows(tier, rows)) for tier in GPU_TIERS),
            (POD_HOUR, pod_rollup_rows(rows, pods)),
            *((tier, activity_rows(tier, rows)) for tier in ACTIVITY_TIERS),
        ):
            if upserts:
                build = activity_statement if tier in ACTIVITY_TIERS else rollup_statement
                cursor.executemany(
                    self._statement(build, tier, upserts[0]),
                    [self._database.bind(upsert) for upsert in upserts],
                )

    def _upsert_pods(self, cursor: Any, pods: list[PodUsage], at: datetime) -> None:
        rows = _merge_duplicate_pods([_pod_row(pod, at) for pod in pods])
        if rows:
            cursor.executemany(
                self._statement(_pod_statement, "pod_usage", rows[0]),
                [self._database.bind(row) for row in rows],
            )


def upsert_pod_statement(database: Database, columns: Iterable[str]) -> str:
    """The pod_usage upsert: peaks only grow, first/last seen widen, GPUs and owner persist."""

    def extreme(larger: bool, column: str) -> str:
        return merged(database, "pod_usage", column, Merge.LARGER if larger else Merge.SMALLER)

    updates = {column: extreme(True, column) for column in _PEAK_COLUMNS}
    updates["first_seen"] = extreme(False, "first_seen")
    updates["last_seen"] = extreme(True, "last_seen")
    # A pod seen without GPUs this cycle (it holds them but they left the window) keeps the
    # GPUs it was seen with: a finished pod stays in the report with its GPU-hours.
    for column in ("gpus", "gpu_count"):
        updates[column] = (
            f"CASE WHEN excluded.gpu_count > 0 THEN excluded.{column} ELSE pod_usage.{column} END"
        )
    for column in ("owner_kind", "owner_name", "gpu_attribution", "network_attributable"):
        updates[column] = merged(database, "pod_usage", column, Merge.KNOWN)
    return upsert_statement(database, "pod_usage", columns, _POD_KEY, updates)


def _pod_statement(database: Database, _table: str, columns: Iterable[str]) -> str:
    return upsert_pod_statement(database, columns)


def _partitions_needed(result: CycleResult) -> list[tuple[str, datetime]]:
    """(table, time) of every partition the cycle's rows may go to: the raw row's day, and
    each rollup bucket back to the start of the window (the longest a row covers)."""
    moments = [result.at]
    moment = result.at - timedelta(seconds=result.window_seconds)
    while moment < result.at:
        moments.append(moment)
        moment += timedelta(days=1)
    return [("gpu_window", result.at)] + [
        (table, moment) for table in SCHEMES if table != "gpu_window" for moment in moments
    ]


def _written(last_at: datetime | None, at: datetime) -> bool:
    return last_at is not None and last_at >= at


def _gpu_identity(profile: GpuProfile) -> tuple[str, str, str]:
    return profile.gpu, profile.uuid, profile.mig_instance


def _gpu_window_row(
    result: CycleResult, profile: GpuProfile, previous_at: datetime | None
) -> dict[str, Any]:
    covers = result.window_seconds
    if previous_at is not None:
        covers = min(max((result.at - previous_at).total_seconds(), 0.0), covers)
    if profile.first_sample is not None:  # a node (or exporter) younger than the window
        covers = min(max(result.at.timestamp() - profile.first_sample, 0.0), covers)
    return {
        "at": result.at,
        "node": result.node,
        "gpu": profile.gpu,
        "uuid": profile.uuid,
        "job_type": profile.job_type,
        "period_seconds": profile.period_seconds,
        "window_seconds": result.window_seconds,
        "covers_seconds": covers,
        "util_max": _finite(field_stat(profile, GPU_UTIL, "max")),
        "util_p95": _finite(field_stat(profile, GPU_UTIL, "p95")),
        "util_mean": _finite(field_stat(profile, GPU_UTIL, "mean")),
        "util_idle_fraction": _finite(field_stat(profile, GPU_UTIL, "idle_fraction")),
        "mem_copy_util_max": _finite(field_stat(profile, MEM_COPY_UTIL)),
        "fb_used_max_mib": _finite(field_stat(profile, FB_USED)),
        "namespace": profile.namespace,
        "pod": profile.pod,
        "confidence": profile.confidence,
        "basis": profile.basis,
        "reasons": "; ".join(profile.reasons)[:REASONS_LENGTH] or None,
        "owner_kind": profile.owner_kind,
        "owner_name": profile.owner_name,
        "engine": profile.engine,
        "framework": profile.framework,
        "gpu_i_id": profile.mig_instance,
        "mig_profile": profile.mig_profile or None,
        "gpu_model": (profile.gpu_model or "")[:256] or None,
        "sharing": profile.sharing,
        "replicas": profile.replicas,
        "sm_active_p95": _finite(field_stat(profile, SM_ACTIVE, "p95")),
        "sm_active_mean": _finite(field_stat(profile, SM_ACTIVE, "mean")),
        "dram_active_p95": _finite(field_stat(profile, DRAM_ACTIVE, "p95")),
    }


def _pod_row(pod: PodUsage, at: datetime) -> dict[str, Any]:
    return {
        "namespace": pod.namespace,
        "pod": pod.pod,
        "node": pod.node,
        "pod_start_time": pod.start_time or UNKNOWN_START_TIME,
        "gpus": ",".join(pod.gpus),
        "gpu_count": len(pod.gpus),
        "gpu_util_max": _finite(pod.gpu_util_max),
        "gpu_mem_copy_util_max": _finite(pod.gpu_mem_copy_util_max),
        "fb_used_max_mib": _finite(pod.fb_used_max_mib),
        "cpu_util_max": _finite(pod.cpu_util_max),
        "mem_used_max_bytes": _finite(pod.mem_used_max_bytes),
        # Its GPUs' samples tell when the pod was seen; a pod without samples, now.
        "first_seen": min(pod.first_seen or at, at),
        "last_seen": min(pod.last_seen or at, at),
        "owner_kind": pod.owner_kind,
        "owner_name": pod.owner_name,
        **{
            io_column(direction, statistic): _finite(
                pod.io.stat(direction, statistic) if pod.io else None
            )
            for direction in IO_DIRECTIONS
            for statistic in IO_STATISTICS
        },
        "network_attributable": pod.io.network_attributable if pod.io else None,
        "gpu_attribution": pod.gpu_attribution,
    }


def _finite(value: float | None) -> float | None:
    """NaN and infinities (no samples) are stored as NULL."""
    return None if value is None or not math.isfinite(value) else float(value)


def _merge_duplicate_pods(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per key: an upsert statement may not touch the same row twice."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[column] for column in _POD_KEY)
        if key not in merged:
            merged[key] = row
            continue
        kept = merged[key]
        for column in _PEAK_COLUMNS:
            values = [value for value in (kept[column], row[column]) if value is not None]
            kept[column] = max(values, default=None)
    return list(merged.values())
