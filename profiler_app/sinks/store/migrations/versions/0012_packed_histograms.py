"""Packed histograms: activity_hour_packed and activity_day_packed, one row per workload and
complete bucket holding every metric's histogram

Revision ID: 0012_packed_histograms
Revises: 0011_rightsize_per_workload
Create Date: 2026-11-29 12:00:00.000000

Upgrade: the tables (on PostgreSQL with monthly partitions for this month and the next; the
writer adds the others). The histogram rows stay as they are: the writer packs complete buckets
at its next packing (``sinks/store/packing.py``).

Downgrade: every packed row goes back into row form, each record added to the row of its
workload, bucket, metric and percent (a row there already, from a late write, adds up), and the
tables are dropped. Nothing is lost.
"""

# SQL here is built from the revision's own constant table and column names; no values.
# ruff: noqa: S608

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0012_packed_histograms"
down_revision: str | None = "0011_rightsize_per_workload"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BUCKETS = ("hour", "day")
PERCENTS = 101
METRICS = ("sm", "sm_mean", "dram")  # a packed cell's metric: cell // PERCENTS
RECORD = np.dtype([("cell", "<u2"), ("seconds", "<f8")])
CHUNK_ROWS = 1_000


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for bucket in BUCKETS:
        table = f"activity_{bucket}_packed"
        op.create_table(
            table,
            sa.Column(bucket, sa.DateTime(timezone=True), nullable=False),
            sa.Column("namespace", sa.String(length=253), nullable=False),
            sa.Column("workload", sa.String(length=253), nullable=False),
            sa.Column("histograms", sa.LargeBinary(), nullable=False),
            postgresql_partition_by=f"RANGE ({bucket})",
        )
        op.create_index(op.f(f"ix_{table}_{bucket}"), table, [bucket])
        if postgresql:
            _partition(table)


def _partition(table: str) -> None:
    """This month's partition and the next (the writer and packing add the others)."""
    month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for _ in range(2):
        upper = (month + timedelta(days=32)).replace(day=1)
        op.execute(
            f"CREATE TABLE {table}_p{month:%Y%m} (LIKE {table} INCLUDING DEFAULTS"
            " INCLUDING CONSTRAINTS)"
        )
        op.execute(
            f"ALTER TABLE {table} ATTACH PARTITION {table}_p{month:%Y%m} FOR VALUES"
            f" FROM ('{month:%Y-%m-%d %H:%M:%S}+00') TO ('{upper:%Y-%m-%d %H:%M:%S}+00')"
        )
        month = upper


def _month_partitions(table: str, bucket: str) -> None:
    """PostgreSQL: the row-form table's partitions for the packed rows' months, where missing
    (retention drops both tables' months together, so these are there but for mishaps)."""
    bind = op.get_bind()
    months = bind.exec_driver_sql(
        f"SELECT DISTINCT date_trunc('month', {bucket} AT TIME ZONE 'UTC')"
        f" FROM activity_{bucket}_packed"
    ).all()
    for (month,) in months:
        name = f"{table}_p{month:%Y%m}"
        if bind.exec_driver_sql(f"SELECT to_regclass('{name}')").scalar() is not None:
            continue
        upper = (month + timedelta(days=32)).replace(day=1)
        op.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        op.execute(
            f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES"
            f" FROM ('{month:%Y-%m-%d %H:%M:%S}+00') TO ('{upper:%Y-%m-%d %H:%M:%S}+00')"
        )


def downgrade() -> None:
    bind = op.get_bind()
    for bucket in reversed(BUCKETS):
        table, packed = f"activity_{bucket}", f"activity_{bucket}_packed"
        if bind.dialect.name == "postgresql":
            _month_partitions(table, bucket)
        add = sa.text(
            f"INSERT INTO {table} ({bucket}, namespace, workload, metric, percent, seconds)"
            f" VALUES (:{bucket}, :namespace, :workload, :metric, :percent, :seconds)"
            f" ON CONFLICT ({bucket}, namespace, workload, metric, percent)"
            f" DO UPDATE SET seconds = {table}.seconds + excluded.seconds"
        )
        result = bind.exec_driver_sql(
            f"SELECT {bucket}, namespace, workload, histograms FROM {packed}"
        )
        while chunk := result.fetchmany(CHUNK_ROWS):
            rows = []
            for moment, namespace, workload, blob in chunk:
                for cell, seconds in np.frombuffer(bytes(blob), RECORD).tolist():
                    metric, percent = divmod(int(cell), PERCENTS)
                    rows.append(
                        {
                            bucket: moment,
                            "namespace": namespace,
                            "workload": workload,
                            "metric": METRICS[metric],
                            "percent": percent,
                            "seconds": seconds,
                        }
                    )
            if rows:
                bind.execute(add, rows)
        op.drop_table(packed)
