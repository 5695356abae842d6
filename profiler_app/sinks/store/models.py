"""Table definitions of the store (SQLAlchemy 2 typed declarative models).

Every schema change goes with an Alembic revision in ``migrations/versions``; a test checks that
the migrated schema and these models agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# PostgreSQL's unique keys treat NULLs as distinct, so an unknown pod start time would never
# conflict and every cycle would add a row; the epoch stands in for "unknown" instead.
UNKNOWN_START_TIME = datetime(1970, 1, 1, tzinfo=UTC)
# Reasons are stored joined by "; " and cut to this length (a handful of short reasons fit).
REASONS_LENGTH = 512

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL keeps them as ``timestamptz``; SQLite has no time zones, so values are stored as
    naive UTC (which also keeps its text timestamps comparable) and read back as aware UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} given to the store; use UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class GpuWindow(Base):
    """One GPU's profile from one cycle: what it did over the trailing window ending at ``at``.

    ``covers_seconds`` is the wall time this row stands for: the time since the previous row of
    the same GPU, capped at the window (so daemon restarts and gaps are neither lost nor counted
    twice). The report weights rows by it.
    """

    __tablename__ = "gpu_window"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    node: Mapped[str] = mapped_column(String(253))
    gpu: Mapped[str] = mapped_column(String(32))
    uuid: Mapped[str] = mapped_column(String(64))
    job_type: Mapped[str] = mapped_column(String(16))
    period_seconds: Mapped[float | None] = mapped_column(Float)
    window_seconds: Mapped[float] = mapped_column(Float)
    covers_seconds: Mapped[float] = mapped_column(Float)
    util_max: Mapped[float | None] = mapped_column(Float)
    util_p95: Mapped[float | None] = mapped_column(Float)
    util_mean: Mapped[float | None] = mapped_column(Float)
    util_idle_fraction: Mapped[float | None] = mapped_column(Float)
    mem_copy_util_max: Mapped[float | None] = mapped_column(Float)  # memory bandwidth, percent
    fb_used_max_mib: Mapped[float | None] = mapped_column(Float)
    namespace: Mapped[str | None] = mapped_column(String(253))
    pod: Mapped[str | None] = mapped_column(String(253))
    # Revision 0003: how sure the classifier was and why, and the pod's workload.
    confidence: Mapped[float | None] = mapped_column(Float)
    basis: Mapped[str | None] = mapped_column(String(16))
    reasons: Mapped[str | None] = mapped_column(String(REASONS_LENGTH))
    owner_kind: Mapped[str | None] = mapped_column(String(63))
    owner_name: Mapped[str | None] = mapped_column(String(253))

    __table_args__ = (
        # The report filters on time (optionally node) and walks each GPU's rows in time order.
        Index(None, "at"),
        Index(None, "node", "gpu", "at"),
    )


class PodUsage(Base):
    """Peak use of one pod that held GPUs; values only ever grow (upsert keeping the max)."""

    __tablename__ = "pod_usage"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    pod: Mapped[str] = mapped_column(String(253), primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    pod_start_time: Mapped[datetime] = mapped_column(UtcDateTime(), primary_key=True)
    gpus: Mapped[str] = mapped_column(String(256))  # comma-separated GPU indices
    gpu_count: Mapped[int] = mapped_column(Integer)
    gpu_util_max: Mapped[float | None] = mapped_column(Float)
    gpu_mem_copy_util_max: Mapped[float | None] = mapped_column(Float)
    fb_used_max_mib: Mapped[float | None] = mapped_column(Float)
    cpu_util_max: Mapped[float | None] = mapped_column(Float)
    mem_used_max_bytes: Mapped[float | None] = mapped_column(Float)
    first_seen: Mapped[datetime] = mapped_column(UtcDateTime())
    last_seen: Mapped[datetime] = mapped_column(UtcDateTime())
    owner_kind: Mapped[str | None] = mapped_column(String(63))  # revision 0003
    owner_name: Mapped[str | None] = mapped_column(String(253))

    __table_args__ = (Index(None, "last_seen"),)


class TraceGpu(Base):
    """One GPU in one Nsight Systems report, as ``gpu-profiler trace`` summarised it.

    Keyed by pod, node and the report's capture start (empty strings where not given), as the
    continuous profile's pods are; tracing the same report again replaces its rows.
    """

    __tablename__ = "trace_gpu"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    pod: Mapped[str] = mapped_column(String(253), primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime(), primary_key=True)
    device: Mapped[int] = mapped_column(Integer, primary_key=True)
    report: Mapped[str] = mapped_column(String(1024))
    recorded_at: Mapped[datetime] = mapped_column(UtcDateTime())
    gpu_name: Mapped[str | None] = mapped_column(String(256))
    uuid: Mapped[str | None] = mapped_column(String(64))
    span_seconds: Mapped[float] = mapped_column(Float)
    busy_fraction: Mapped[float] = mapped_column(Float)
    idle_gap_count: Mapped[int] = mapped_column(BigInteger)
    idle_total_seconds: Mapped[float] = mapped_column(Float)
    idle_longest_seconds: Mapped[float] = mapped_column(Float)
    kernel_count: Mapped[int] = mapped_column(BigInteger)
    kernel_seconds: Mapped[float] = mapped_column(Float)
    memory_seconds: Mapped[float] = mapped_column(Float)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    pageable_seconds: Mapped[float] = mapped_column(Float)
    launch_api_seconds: Mapped[float] = mapped_column(Float)
    sync_api_seconds: Mapped[float] = mapped_column(Float)
    iteration_seconds: Mapped[float | None] = mapped_column(Float)
    profiler_period_seconds: Mapped[float | None] = mapped_column(Float)
    verdict: Mapped[str] = mapped_column(String(16))
    evidence: Mapped[str] = mapped_column(Text)
    top_kernel: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index(None, "started_at"),)
