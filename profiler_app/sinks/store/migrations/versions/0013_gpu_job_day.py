"""gpu_job_day: whole days per GPU (or MIG instance) and job type, for the node and GPU views

Revision ID: 0013_gpu_job_day
Revises: 0012_packed_histograms
Create Date: 2026-11-29 16:00:00.000000

``gpu_day`` keeps one row per GPU, job type, workload and day, so the node and GPU views read
more rows the more workloads share a GPU's day. ``gpu_job_day`` holds the same days summed over
the workloads: one row per GPU, job type and day.

Upgrade: the table (on PostgreSQL with monthly partitions for ``gpu_day``'s months, this month
and the next; the writer adds the others), filled from ``gpu_day`` by the rules the writer
merges by (``rollups.GPU_VALUES``, restated here: revisions do not import the package): times
add up, peaks and the longest row keep the larger, the shortest period the smaller. It is
exact: both tables cut the raw rows' time at the same day boundaries.

Downgrade: the table is dropped; nothing else is touched.
"""

# SQL here is built from the revision's own constant table and column names; no values.
# ruff: noqa: S608

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0013_gpu_job_day"
down_revision: str | None = "0012_packed_histograms"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "gpu_job_day"
ROLLUP_FILLFACTOR = 70
KEY = ("day", "node", "gpu", "uuid", "gpu_i_id", "job_type")
MERGES = {
    "covered_seconds": "sum",
    "idle_gpu_seconds": "sum",
    "util_max": "max",
    "mem_copy_util_max": "max",
    "fb_used_max_mib": "max",
    "covers_max_seconds": "max",
    "period_seconds_min": "min",
    "period_seconds_max": "max",
    "period_covered_seconds": "sum",
    "period_weighted_sum": "sum",
}
OPTIONAL = {
    "util_max",
    "mem_copy_util_max",
    "fb_used_max_mib",
    "period_seconds_min",
    "period_seconds_max",
}


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("day", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu", sa.String(length=32), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("gpu_i_id", sa.String(length=8), nullable=False, server_default=""),
        sa.Column("job_type", sa.String(length=16), nullable=False),
        *(sa.Column(column, sa.Float(), nullable=column in OPTIONAL) for column in MERGES),
        sa.PrimaryKeyConstraint(*KEY, name=op.f(f"pk_{TABLE}")),
        postgresql_partition_by="RANGE (day)",
    )
    if op.get_bind().dialect.name == "postgresql":
        _partition()
    keys = ", ".join(KEY)
    values = ", ".join(f"{how}({column})" for column, how in MERGES.items())
    op.execute(
        f"INSERT INTO {TABLE} ({keys}, {', '.join(MERGES)})"
        f" SELECT {keys}, {values} FROM gpu_day GROUP BY {keys}"
    )


def _months(first: datetime, last: datetime) -> list[datetime]:
    month = datetime(first.year, first.month, 1, tzinfo=UTC)
    months = []
    while month <= last:
        months.append(month)
        month = (month + timedelta(days=32)).replace(day=1)
    return months


def _partition() -> None:
    """Monthly partitions for gpu_day's months, this month and the next."""
    now = datetime.now(UTC)
    months = set(_months(now, now.replace(day=1) + timedelta(days=32)))
    first, last = op.get_bind().exec_driver_sql("SELECT min(day), max(day) FROM gpu_day").one()
    if first is not None:
        months.update(_months(first.astimezone(UTC), last.astimezone(UTC)))
    for month in sorted(months):
        upper = (month + timedelta(days=32)).replace(day=1)
        name = f"{TABLE}_p{month:%Y%m}"
        op.execute(
            f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            f" WITH (fillfactor = {ROLLUP_FILLFACTOR})"
        )
        op.execute(
            f"ALTER TABLE {TABLE} ATTACH PARTITION {name} FOR VALUES"
            f" FROM ('{month:%Y-%m-%d %H:%M:%S}+00') TO ('{upper:%Y-%m-%d %H:%M:%S}+00')"
        )


def downgrade() -> None:
    op.drop_table(TABLE)
