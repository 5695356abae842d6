"""Right-sizing's rollups keyed by workload, not by GPU: rightsize_hour and rightsize_day per
namespace, workload, GPU model and MIG profile; activity_hour and activity_day per namespace,
workload, metric and 1 %-wide bucket

Revision ID: 0011_rightsize_per_workload
Revises: 0010_rightsize_rollups
Create Date: 2026-11-29 08:00:00.000000

The report advises per workload and merges everything it reads over the workload's GPUs, so the
GPU in the key only multiplied the rows a report reads (``sinks/store/activity.py``).

Upgrade: each table's rows are merged over the GPUs into a scratch table (sums add, peaks and
the last moment keep the largest, the first moment the smallest; an unknown GPU model or a
whole GPU's MIG profile becomes ''), the table is dropped and made again with the new key (on
PostgreSQL with monthly partitions for the rows' months, this month and the next), and the rows
go back. Nothing is lost: every bucket the old tables held is in the new ones.

Downgrade: the tables are made again per GPU and filled from the raw rows still kept, as
revision 0010 fills them (the merged rows cannot be split back over GPUs); right-sizing's
history older than the raw rows is lost.
"""

# SQL here is built from the revision's own constant table and column names; no values.
# ruff: noqa: S608

import importlib.util
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0011_rightsize_per_workload"
down_revision: str | None = "0010_rightsize_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLUP_FILLFACTOR = 70
BUCKETS = ("hour", "day")
SUMMARY_KEY = "namespace, workload, gpu_model, mig_profile"
HISTOGRAM_KEY = "namespace, workload, metric, percent"
SUMMARY_VALUES = (
    "sum(covered_seconds) AS covered_seconds, sum(idle_gpu_seconds) AS idle_gpu_seconds,"
    " max(util_max) AS util_max, max(fb_used_max_mib) AS fb_used_max_mib,"
    " min(first_start) AS first_start, max(last_end) AS last_end,"
    " sum(period_covered_seconds) AS period_covered_seconds"
)
SUMMARY_COLUMNS = (
    "covered_seconds, idle_gpu_seconds, util_max, fb_used_max_mib, first_start, last_end,"
    " period_covered_seconds"
)


def _key(bucket: str) -> list[sa.Column[object]]:
    return [
        sa.Column(bucket, sa.DateTime(timezone=True), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("workload", sa.String(length=253), nullable=False),
    ]


def _create_tables(bucket: str) -> None:
    op.create_table(
        f"rightsize_{bucket}",
        *_key(bucket),
        sa.Column("gpu_model", sa.String(length=256), nullable=False),
        sa.Column("mig_profile", sa.String(length=32), nullable=False),
        sa.Column("covered_seconds", sa.Float(), nullable=False),
        sa.Column("idle_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("fb_used_max_mib", sa.Float(), nullable=True),
        sa.Column("first_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_covered_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            bucket, *SUMMARY_KEY.split(", "), name=op.f(f"pk_rightsize_{bucket}")
        ),
        postgresql_partition_by=f"RANGE ({bucket})",
    )
    op.create_table(
        f"activity_{bucket}",
        *_key(bucket),
        sa.Column("metric", sa.String(length=8), nullable=False),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            bucket, *HISTOGRAM_KEY.split(", "), name=op.f(f"pk_activity_{bucket}")
        ),
        postgresql_partition_by=f"RANGE ({bucket})",
    )


def _months(first: datetime, last: datetime) -> list[datetime]:
    month = datetime(first.year, first.month, 1, tzinfo=UTC)
    months = []
    while month <= last:
        months.append(month)
        month = (month + timedelta(days=32)).replace(day=1)
    return months


def _partition(bucket: str, first: datetime | None, last: datetime | None) -> None:
    """Monthly partitions for the kept rows' buckets, this month and the next (the writer adds
    later ones)."""
    now = datetime.now(UTC)
    months = set(_months(now, now.replace(day=1) + timedelta(days=32)))
    if first is not None and last is not None:
        months.update(_months(first.astimezone(UTC), last.astimezone(UTC)))
    for table in (f"rightsize_{bucket}", f"activity_{bucket}"):
        for month in sorted(months):
            upper = (month + timedelta(days=32)).replace(day=1)
            op.execute(
                f"CREATE TABLE {table}_p{month:%Y%m} (LIKE {table} INCLUDING DEFAULTS"
                f" INCLUDING CONSTRAINTS) WITH (fillfactor = {ROLLUP_FILLFACTOR})"
            )
            op.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {table}_p{month:%Y%m} FOR VALUES"
                f" FROM ('{month:%Y-%m-%d %H:%M:%S}+00') TO ('{upper:%Y-%m-%d %H:%M:%S}+00')"
            )


def upgrade() -> None:
    bind = op.get_bind()
    postgresql = bind.dialect.name == "postgresql"
    for bucket in BUCKETS:
        summary, histogram = f"rightsize_{bucket}", f"activity_{bucket}"
        model = "coalesce(gpu_model, '') AS gpu_model, coalesce(mig_profile, '') AS mig_profile"
        op.execute(
            f"CREATE TEMPORARY TABLE merged_{summary} AS SELECT {bucket},"
            f" namespace, workload, {model}, {SUMMARY_VALUES}"
            f" FROM {summary} GROUP BY {bucket}, namespace, workload,"
            " coalesce(gpu_model, ''), coalesce(mig_profile, '')"
        )
        op.execute(
            f"CREATE TEMPORARY TABLE merged_{histogram} AS SELECT {bucket}, {HISTOGRAM_KEY},"
            f" sum(seconds) AS seconds FROM {histogram} GROUP BY {bucket}, {HISTOGRAM_KEY}"
        )
        first, last = bind.exec_driver_sql(
            f"SELECT min({bucket}), max({bucket}) FROM merged_{summary}"
        ).one()
        op.drop_table(histogram)
        op.drop_table(summary)
        _create_tables(bucket)
        if postgresql:
            _partition(bucket, _aware(first), _aware(last))
        op.execute(
            f"INSERT INTO {summary} ({bucket}, {SUMMARY_KEY}, {SUMMARY_COLUMNS})"
            f" SELECT * FROM merged_{summary}"
        )
        op.execute(
            f"INSERT INTO {histogram} ({bucket}, {HISTOGRAM_KEY}, seconds)"
            f" SELECT * FROM merged_{histogram}"
        )
        op.execute(f"DROP TABLE merged_{summary}")
        op.execute(f"DROP TABLE merged_{histogram}")


def _aware(value: object) -> datetime | None:
    """A bucket read back from the scratch table (SQLite: its text)."""
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _revision_0010() -> ModuleType:
    """Revision 0010, whose upgrade makes and fills the per-GPU tables from the raw rows."""
    path = Path(__file__).with_name("0010_rightsize_rollups.py")
    spec = importlib.util.spec_from_file_location("rightsize_rollups_0010", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    for bucket in reversed(BUCKETS):
        op.drop_table(f"activity_{bucket}")
        op.drop_table(f"rightsize_{bucket}")
    _revision_0010().upgrade()
