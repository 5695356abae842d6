"""``TableStore``: the sink that writes each cycle to the store in one transaction."""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, case, func, insert, select
from sqlalchemy.exc import SQLAlchemyError

from profiler_app.errors import UserError
from profiler_app.model import FB_USED, GPU_UTIL, MEM_COPY_UTIL, CycleResult, GpuProfile, PodUsage
from profiler_app.sinks import field_stat
from profiler_app.sinks.store.engine import (
    UnknownSchemaError,
    create_store_engine,
    describe_error,
    display_url,
    parse_store_url,
    sqlite_path,
    upgrade_to_head,
)
from profiler_app.sinks.store.migrate import MigrationFailedError, migrate_in_child
from profiler_app.sinks.store.models import (
    REASONS_LENGTH,
    UNKNOWN_START_TIME,
    gpu_window,
    pod_usage,
)
from profiler_app.sinks.store.retention import Retention

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PostgresqlInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

log = logging.getLogger(__name__)

_PEAK_COLUMNS = (
    "gpu_util_max",
    "gpu_mem_copy_util_max",
    "fb_used_max_mib",
    "cpu_util_max",
    "mem_used_max_bytes",
)
_POD_KEY = ("namespace", "pod", "node", "pod_start_time")


class StoreError(Exception):
    """Writing to the store failed (e.g. PostgreSQL is down); the next cycle tries again."""


class TableStore:
    """Sink writing per-GPU window rows and per-pod peaks; migrates the schema on start."""

    name = "store"

    def __init__(
        self, url: str, *, retention_seconds: float | None = None, migrate_in_child: bool = False
    ) -> None:
        """``migrate_in_child``: the daemon's choice, to keep Alembic out of its memory."""
        parsed = parse_store_url(url)
        self.url = display_url(parsed)
        self._url = url  # with its password: only for the migration process's environment
        self._migrate_in_child = migrate_in_child
        self._engine = create_store_engine(parsed, create_file=True)
        self._retention = Retention(retention_seconds) if retention_seconds else None
        # Last row time per node and GPU (index and UUID), loaded from the store once per node.
        self._last_at: dict[str, dict[tuple[str, str], datetime]] = {}
        self._migrated = False
        try:
            self._migrate()
        except StoreError as error:
            if sqlite_path(parsed) is not None:
                raise UserError(str(error)) from None
            # PostgreSQL may come up after the daemon; publish retries the migration.
            log.warning("%s; will retry on the next cycle", error)

    def publish(self, result: CycleResult) -> None:
        if not self._migrated:
            self._migrate()
        try:
            with self._engine.begin() as connection:
                last_at = self._load_last_at(connection, result.node)
                self._insert_gpu_windows(connection, result, last_at)
                self._upsert_pods(connection, result.pods, result.at)
        except SQLAlchemyError as error:
            raise StoreError(f"store {self.url}: {describe_error(error)}") from error
        # Only a committed cycle moves the covered-time bookkeeping forward.
        node_last = self._last_at.setdefault(result.node, last_at)
        for profile in result.gpus:
            node_last[profile.gpu, profile.uuid] = result.at
        if self._retention is not None and self._retention.due():
            self._prune(self._retention, result.at)

    def close(self) -> None:
        self._engine.dispose()

    def _prune(self, retention: Retention, now: datetime) -> None:
        # The cycle's rows are committed: a failed clean-up is retried, not a failed cycle.
        try:
            retention.prune(self._engine, now)
        except SQLAlchemyError as error:
            log.warning(
                "store %s: retention failed, retrying next cycle: %s",
                self.url,
                describe_error(error),
            )

    def _migrate(self) -> None:
        try:
            if self._migrate_in_child:
                migrate_in_child(self._engine, self._url)
            else:
                upgrade_to_head(self._engine)
        except UnknownSchemaError as error:
            raise UserError(
                f"store {self.url} has a schema this gpu-profiler does not know ({error}); "
                "upgrade gpu-profiler"
            ) from None
        except SQLAlchemyError as error:
            raise StoreError(f"store {self.url}: {describe_error(error)}") from error
        except MigrationFailedError as error:
            raise StoreError(f"store {self.url}: migration failed: {error}") from None
        self._migrated = True

    def _load_last_at(self, connection: Connection, node: str) -> dict[tuple[str, str], datetime]:
        cached = self._last_at.get(node)
        if cached is not None:
            return dict(cached)
        rows = connection.execute(
            select(gpu_window.c.gpu, gpu_window.c.uuid, func.max(gpu_window.c.at))
            .where(gpu_window.c.node == node)
            .group_by(gpu_window.c.gpu, gpu_window.c.uuid)
        )
        return {(gpu, uuid): at for gpu, uuid, at in rows if at is not None}

    def _insert_gpu_windows(
        self,
        connection: Connection,
        result: CycleResult,
        last_at: dict[tuple[str, str], datetime],
    ) -> None:
        rows = [
            _gpu_window_row(result, profile, last_at.get((profile.gpu, profile.uuid)))
            for profile in result.gpus
        ]
        if rows:
            connection.execute(insert(gpu_window), rows)

    def _upsert_pods(self, connection: Connection, pods: list[PodUsage], at: datetime) -> None:
        rows = _merge_duplicate_pods([_pod_row(pod, at) for pod in pods])
        if not rows:
            return
        dialect = connection.dialect.name
        statement = _upsert_statement(dialect)
        table = pod_usage.c
        excluded = statement.excluded
        updates: dict[str, Any] = {
            column: _larger(dialect, table[column], excluded[column]) for column in _PEAK_COLUMNS
        }
        updates["first_seen"] = _smaller(dialect, table.first_seen, excluded.first_seen)
        updates["last_seen"] = _larger(dialect, table.last_seen, excluded.last_seen)
        # A pod seen without GPUs this cycle (it holds them but they left the window) keeps the
        # GPUs it was seen with: a finished pod stays in the report with its GPU-hours.
        has_gpus = excluded.gpu_count > 0
        updates["gpus"] = case((has_gpus, excluded.gpus), else_=table.gpus)
        updates["gpu_count"] = case((has_gpus, excluded.gpu_count), else_=table.gpu_count)
        for column in ("owner_kind", "owner_name"):
            updates[column] = func.coalesce(excluded[column], table[column])
        connection.execute(
            statement.on_conflict_do_update(index_elements=list(_POD_KEY), set_=updates), rows
        )


def _upsert_statement(dialect: str) -> PostgresqlInsert | SqliteInsert:
    """The dialect's INSERT ... ON CONFLICT for pod_usage (only the one in use is imported)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert  # noqa: PLC0415

        return postgresql_insert(pod_usage)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert  # noqa: PLC0415

    return sqlite_insert(pod_usage)


def _gpu_window_row(
    result: CycleResult, profile: GpuProfile, previous_at: datetime | None
) -> dict[str, Any]:
    if previous_at is None:
        covers = result.window_seconds
    else:
        since_previous = (result.at - previous_at).total_seconds()
        covers = min(max(since_previous, 0.0), result.window_seconds)
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


def _larger(dialect: str, current: Any, new: Any) -> ColumnElement[Any]:
    """The larger of two values, NULL only when both are (PostgreSQL's GREATEST skips NULLs)."""
    if dialect == "postgresql":
        return func.greatest(current, new)
    return func.max(func.coalesce(current, new), func.coalesce(new, current))


def _smaller(dialect: str, current: Any, new: Any) -> ColumnElement[Any]:
    if dialect == "postgresql":
        return func.least(current, new)
    return func.min(func.coalesce(current, new), func.coalesce(new, current))
