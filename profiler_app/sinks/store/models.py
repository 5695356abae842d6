"""Table definitions of the store (SQLAlchemy Core tables): the one definition of the schema.

Alembic's revisions, ``report`` and ``trace`` use them; the daemon's writer (``sink.py``,
``retention.py``) names the same columns in plain SQL through the DB-API drivers, to keep
SQLAlchemy out of its memory, and tests hold it to these tables. Every schema change goes with
an Alembic revision in ``migrations/versions``; a test checks that the migrated schema and these
tables agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect

from profiler_app.sinks.store.schema import POD_HOUR_IO_COLUMNS, POD_IO_COLUMNS, REASONS_LENGTH

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


metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _instance(*, key: bool = False) -> Column[Any]:
    """A MIG instance's GPU_I_ID, '' for a whole GPU (revision 0009)."""
    return Column("gpu_i_id", String(8), nullable=False, primary_key=key, server_default="")


def _optional(name: str, kind: Any) -> Column[Any]:
    return Column(name, kind, nullable=True)


def _required(name: str, kind: Any, *, key: bool = False) -> Column[Any]:
    return Column(name, kind, nullable=False, primary_key=key)


# One GPU's profile from one cycle: what it did over the trailing window ending at ``at``.
# ``covers_seconds`` is the wall time this row stands for: the time since the previous row of
# the same GPU, capped at the window (so daemon restarts and gaps are neither lost nor counted
# twice). The report weights rows by it.
gpu_window = Table(
    "gpu_window",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    _required("at", UtcDateTime()),
    _required("node", String(253)),
    _required("gpu", String(32)),
    _required("uuid", String(64)),
    _required("job_type", String(16)),
    _optional("period_seconds", Float),
    _required("window_seconds", Float),
    _required("covers_seconds", Float),
    _optional("util_max", Float),
    _optional("util_p95", Float),
    _optional("util_mean", Float),
    _optional("util_idle_fraction", Float),
    _optional("mem_copy_util_max", Float),  # memory bandwidth, percent
    _optional("fb_used_max_mib", Float),
    _optional("namespace", String(253)),
    _optional("pod", String(253)),
    # Revision 0003: how sure the classifier was and why, and the pod's workload.
    _optional("confidence", Float),
    _optional("basis", String(16)),
    _optional("reasons", String(REASONS_LENGTH)),
    _optional("owner_kind", String(63)),
    _optional("owner_name", String(253)),
    # Revision 0006: what ran on the GPU (profiler_app.profiles.engines' names).
    _optional("engine", String(32)),
    _optional("framework", String(32)),
    # Revision 0009: the MIG instance (dcgm-exporter's GPU_I_ID, '' for a whole GPU) and its
    # profile, the GPU model, and how the GPU is shared (none, time-slicing, mps) in how many.
    _instance(),
    _optional("mig_profile", String(32)),
    _optional("gpu_model", String(256)),
    _optional("sharing", String(16)),
    _optional("replicas", Integer),
    # Revision 0009: what right-sizing measures (report --by rightsize), DCGM's ratios 0-1.
    _optional("sm_active_p95", Float),
    _optional("sm_active_mean", Float),
    _optional("dram_active_p95", Float),
    # The report filters on time (optionally node) and walks each GPU's rows in time order.
    Index(None, "at"),
    Index(None, "node", "gpu", "at"),
    # Revision 0007: one partition per UTC day on PostgreSQL (partitions.py), whose primary key
    # is (id, at) there: a partitioned table's unique keys hold its partition column.
    postgresql_partition_by="RANGE (at)",
)

# Peak use of one pod that held GPUs; values only ever grow (upsert keeping the max).
pod_usage = Table(
    "pod_usage",
    metadata,
    _required("namespace", String(253), key=True),
    _required("pod", String(253), key=True),
    _required("node", String(253), key=True),
    _required("pod_start_time", UtcDateTime(), key=True),
    _required("gpus", String(256)),  # comma-separated GPU indices
    _required("gpu_count", Integer),
    _optional("gpu_util_max", Float),
    _optional("gpu_mem_copy_util_max", Float),
    _optional("fb_used_max_mib", Float),
    _optional("cpu_util_max", Float),
    _optional("mem_used_max_bytes", Float),
    _required("first_seen", UtcDateTime()),
    _required("last_seen", UtcDateTime()),
    _optional("owner_kind", String(63)),  # revision 0003
    _optional("owner_name", String(253)),
    # Revision 0008: disk and network bytes per second, the window's peak and 95th percentile
    # (each the largest written); whether its network could be told from the host's.
    *(_optional(column, Float) for column in POD_IO_COLUMNS),
    _optional("network_attributable", Boolean(create_constraint=False)),
    # Revision 0009: on a shared GPU, where its GPU peaks come from (model.SHARED_*).
    _optional("gpu_attribution", String(32)),
    Index(None, "last_seen"),
)

# One GPU in one Nsight Systems report, as ``gpu-profiler trace`` summarised it. Keyed by pod,
# node and the report's capture start (empty strings where not given), as the continuous
# profile's pods are; tracing the same report again replaces its rows.
trace_gpu = Table(
    "trace_gpu",
    metadata,
    _required("namespace", String(253), key=True),
    _required("pod", String(253), key=True),
    _required("node", String(253), key=True),
    _required("started_at", UtcDateTime(), key=True),
    _required("device", Integer, key=True),
    _required("report", String(1024)),
    _required("recorded_at", UtcDateTime()),
    _optional("gpu_name", String(256)),
    _optional("uuid", String(64)),
    _required("span_seconds", Float),
    _required("busy_fraction", Float),
    _required("idle_gap_count", BigInteger),
    _required("idle_total_seconds", Float),
    _required("idle_longest_seconds", Float),
    _required("kernel_count", BigInteger),
    _required("kernel_seconds", Float),
    _required("memory_seconds", Float),
    _required("memory_bytes", BigInteger),
    _required("pageable_seconds", Float),
    _required("launch_api_seconds", Float),
    _required("sync_api_seconds", Float),
    _optional("iteration_seconds", Float),
    _optional("profiler_period_seconds", Float),
    _required("verdict", String(32)),  # revision 0005
    _required("evidence", Text),
    _optional("top_kernel", Text),
    Index(None, "started_at"),
)

# One trial of a `gpu-profiler trial run`: its placement, outcome and throughput. Keyed by the
# run and the trial's name; recording a run again replaces its rows.
trial_result = Table(
    "trial_result",
    metadata,
    _required("run_id", String(64), key=True),
    _required("trial", String(253), key=True),
    _required("recorded_at", UtcDateTime()),
    _required("workload", String(512)),  # KIND/NAMESPACE/NAME of the template
    _required("placement", String(256)),
    _optional("gpu_model", String(256)),
    _required("gpus", Integer),
    _required("gpus_per_pod", Integer),
    _required("pods", Integer),
    _required("nodes", Integer),
    _required("layout", String(16)),
    _required("status", String(16)),
    _optional("estimator", String(16)),
    _optional("throughput", Float),
    _optional("unit", String(64)),
    _optional("throughput_per_gpu", Float),
    _optional("scaling_efficiency", Float),
    _optional("step_seconds", Float),
    _optional("peak_fb_mib", Float),
    _optional("sm_active", Float),
    _required("gpu_seconds", Float),
    _required("pareto", Boolean),
    _required("recommended", Boolean),
    _optional("note", Text),
    _optional("recommendation", Text),  # the run's, on every row of it
    Index(None, "recorded_at"),
)


def _rollup(name: str, bucket: str, *columns: Column[Any] | Index) -> Table:
    """A rollup table (revision 0007): its bucket start first in the key; on PostgreSQL one
    partition per UTC month (partitions.py)."""
    return Table(
        name,
        metadata,
        _required(bucket, UtcDateTime(), key=True),
        *columns,
        postgresql_partition_by=f"RANGE ({bucket})",
    )


def _bucket_ranges(bucket: str) -> Index:
    """A BRIN index on ``bucket`` (PostgreSQL only; revision 0017): each range of pages' first
    and last bucket. The writer appends buckets in time order, so a report's first or last
    hours or days are a few ranges of their month's partition. Through the key's B-tree
    PostgreSQL costs that read as random and scans the whole partition instead: 46,700
    pages for 16 hours of the 8,500-GPU benchmark store, against 7,100 (benchmarks/RESULTS.md).
    ``autosummarize``: ranges filled since are summarised by autovacuum, not at the next
    VACUUM; a range not summarised yet is read whole, never skipped."""
    return Index(
        None, bucket, postgresql_using="brin", postgresql_with={"autosummarize": "on"}
    ).ddl_if(dialect="postgresql")


def _gpu_rollup(name: str, bucket: str, *workload: Column[Any]) -> Table:
    """``gpu_hour``, ``gpu_day`` or ``gpu_job_day``: the raw rows' covered time per bucket,
    keyed by GPU, job type and ``workload`` (what the report groups by: whether the memory was
    held, the pod's name or whether there was one, its owner). Text keys are '' when unknown (a
    key column cannot be NULL). With a workload, an index on its name and the bucket (revision
    0014): waste counts the GPUs of a few workloads, whose rows the key (bucket, GPU, ...,
    workload) finds only by reading all of the range's. And on PostgreSQL a BRIN index on the
    bucket (revision 0017): see ``_bucket_ranges``."""
    workload_index = (Index(None, "owner_name", bucket), _bucket_ranges(bucket)) if workload else ()
    return _rollup(
        name,
        bucket,
        _required("node", String(253), key=True),
        _required("gpu", String(32), key=True),
        _required("uuid", String(64), key=True),
        _instance(key=True),
        _required("job_type", String(16), key=True),
        *workload,
        _required("covered_seconds", Float),
        _required("idle_gpu_seconds", Float),  # covered time x the window's idle fraction
        _optional("util_max", Float),
        _optional("mem_copy_util_max", Float),
        _optional("fb_used_max_mib", Float),
        _required("covers_max_seconds", Float),  # bounds the report's raw reads at the edges
        _optional("period_seconds_min", Float),
        _optional("period_seconds_max", Float),
        _required("period_covered_seconds", Float),  # covered time of rows with a period
        _required("period_weighted_sum", Float),  # sum of period x covered seconds
        *workload_index,
    )


def _workload_keys(pod: Column[Any]) -> tuple[Column[Any], ...]:
    """The keys after the job type that say whose time it was (``pod``: its name, or whether
    there was one)."""
    return (
        _required("memory_held", Boolean(create_constraint=False), key=True),
        _required("namespace", String(253), key=True),
        pod,
        _required("owner_kind", String(63), key=True),
        _required("owner_name", String(253), key=True),
    )


# The raw rows' covered time split into UTC hours and days (rollups.py): the report reads whole
# buckets here and only the partial ones at its range's edges from gpu_window.
gpu_hour = _gpu_rollup("gpu_hour", "hour", *_workload_keys(_required("pod", String(253), key=True)))
# Whole days serve the report only: whether a pod held the GPU, not which (rollups.GPU_DAY_KEY).
_has_pod = _required("has_pod", Boolean(create_constraint=False), key=True)
gpu_day = _gpu_rollup("gpu_day", "day", *_workload_keys(_has_pod))
# Whole days per GPU and job type only (revision 0013): the node and GPU views' days, one row per
# GPU and job type however many workloads shared the day.
gpu_job_day = _gpu_rollup("gpu_job_day", "day")

# Per pod and hour: the covered time of the GPUs whose current pod it was, and its peaks.
pod_hour = _rollup(
    "pod_hour",
    "hour",
    _required("node", String(253), key=True),
    _required("namespace", String(253), key=True),
    _required("pod", String(253), key=True),
    _optional("owner_kind", String(63)),
    _optional("owner_name", String(253)),
    _required("gpus", Integer),  # the most of its GPUs seen in one cycle
    _required("gpu_seconds", Float),
    _required("idle_gpu_seconds", Float),
    _optional("util_max", Float),
    _optional("mem_copy_util_max", Float),
    _optional("fb_used_max_mib", Float),
    _optional("cpu_util_max", Float),
    _optional("mem_used_max_bytes", Float),
    *(_optional(column, Float) for column in POD_HOUR_IO_COLUMNS),  # revision 0008
)


def _workload_key(bucket: str) -> list[Column[Any]]:
    """The key of right-sizing's rollups (activity.py, revision 0011): the workload (the pod's
    owner, else the pod), whatever GPUs it ran on."""
    return [
        _required(bucket, UtcDateTime(), key=True),
        _required("namespace", String(253), key=True),
        _required("workload", String(253), key=True),
    ]


def _rightsize(name: str, bucket: str) -> Table:
    """What right-sizing reads besides the histograms, per bucket (activity.SUMMARY_VALUES)."""
    return Table(
        name,
        metadata,
        *_workload_key(bucket),
        _required("gpu_model", String(256), key=True),  # '' when not known
        _required("mig_profile", String(32), key=True),  # '' for a whole GPU
        _required("covered_seconds", Float),
        _required("idle_gpu_seconds", Float),
        _optional("util_max", Float),
        _optional("fb_used_max_mib", Float),
        _required("first_start", UtcDateTime()),
        _required("last_end", UtcDateTime()),
        _required("period_covered_seconds", Float),  # training rows whose period was found
        postgresql_partition_by=f"RANGE ({bucket})",
    )


def _activity(name: str, bucket: str) -> Table:
    """Histograms of SM and DRAM activity: covered seconds per metric and 1 %-wide bucket."""
    return Table(
        name,
        metadata,
        *_workload_key(bucket),
        _required("metric", String(8), key=True),  # activity.METRICS
        _required("percent", Integer, key=True),  # 0..100
        _required("seconds", Float),
        postgresql_partition_by=f"RANGE ({bucket})",
    )


# Right-sizing's rollups (revisions 0010, 0011): report --by rightsize reads them.
rightsize_hour = _rightsize("rightsize_hour", "hour")
rightsize_day = _rightsize("rightsize_day", "day")
activity_hour = _activity("activity_hour", "hour")
activity_day = _activity("activity_day", "day")


def _packed(name: str, bucket: str) -> Table:
    """The histograms of complete buckets, one row per workload holding every metric's
    (packing.py, revision 0012). No key: a bucket packed again (a late write) adds a row, and
    readers sum the rows of a workload; on PostgreSQL one partition per UTC month. An index on
    the workload's name and the bucket (revision 0018): rightsize reads the rows of the
    workloads it lists, where the bucket's index read every workload's rows of the range."""
    return Table(
        name,
        metadata,
        _required(bucket, UtcDateTime()),
        _required("namespace", String(253)),
        _required("workload", String(253)),
        _required("histograms", LargeBinary),  # packing.RECORD_FIELDS: (cell, seconds) records
        Index(None, bucket),
        Index(None, "workload", bucket),
        postgresql_partition_by=f"RANGE ({bucket})",
    )


activity_hour_packed = _packed("activity_hour_packed", "hour")
activity_day_packed = _packed("activity_day_packed", "day")


def _block_key() -> list[Column[Any]]:
    """The key columns both tables of idle blocks start with: the block, and the workload's
    kind of waste, namespace and owner's kind."""
    return [
        _required("start", UtcDateTime(), key=True),
        _required("days", Integer, key=True),
        _required("memory_held", Boolean(create_constraint=False), key=True),
        _required("has_pod", Boolean(create_constraint=False), key=True),
        _required("namespace", String(253), key=True),
        _required("owner_kind", String(63), key=True),
    ]


# Idle time per workload and whether memory was held or a pod was there, summed over a block
# of whole days aligned on the epoch (revision 0015): ``days`` is a power of two
# (idle_blocks.LEVELS). Made from gpu_day once the days are settled, by one daemon at a time,
# so ``report --by waste`` ranks a month's workloads from a few blocks rather than every day.
idle_block = Table(
    "idle_block",
    metadata,
    *_block_key(),
    _required("owner_name", String(253), key=True),
    _required("idle_gpu_seconds", Float),
)
# The GPUs that added idle time to a block's workloads without an owner name: no pod (each
# GPU's idle time alone, most of a cluster's GPUs in a month), or a pod without a controller
# (revision 0016). waste counts their GPUs here: the index on the owner's name cannot narrow
# gpu_day's rows of those to fewer than all of them. Made and dropped with the block's rows.
idle_block_gpu = Table(
    "idle_block_gpu",
    metadata,
    *_block_key(),
    _required("node", String(253), key=True),
    _required("uuid", String(64), key=True),
    _required("gpu_i_id", String(8), key=True),
    _required("idle_gpu_seconds", Float),
)
# The blocks made: a block with no row is made and empty (nothing idle), not missing.
idle_block_made = Table(
    "idle_block_made",
    metadata,
    _required("start", UtcDateTime(), key=True),
    _required("days", Integer, key=True),
    _required("made_at", UtcDateTime()),
)

# Where retention removed raw rows: gpu_window holds every row of the time after
# ``removed_before``, so the report reads a partial hour before it from its rollup instead.
store_horizon = Table(
    "store_horizon",
    metadata,
    _required("table_name", String(63), key=True),
    _required("removed_before", UtcDateTime()),
)
