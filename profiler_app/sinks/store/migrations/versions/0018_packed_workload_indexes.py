"""activity_hour_packed and activity_day_packed: an index on the workload's name and the bucket

Revision ID: 0018_packed_workload_indexes
Revises: 0017_bucket_ranges
Create Date: 2026-12-01 02:35:00.000000

``report --by rightsize`` ranks the workloads, then merges the histograms of the ones it lists
(ten by default). The packed tables have no key, only an index on the bucket, so that read every
workload's rows of the range and kept the listed ones': over 30 days of the 8,500-GPU benchmark
store, 90,000 pages of ``activity_day_packed`` for 110 rows (benchmarks/RESULTS.md).

Upgrade: ``(workload, hour)`` on ``activity_hour_packed`` and ``(workload, day)`` on
``activity_day_packed``. On PostgreSQL the index is made on the partitioned table, so every
partition has it and the partitions attached later get it. Building it blocks writes to the
table (not reads) for as long as it takes; the packer waits, then commits.

Downgrade: the indexes are dropped.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018_packed_workload_indexes"
down_revision: str | None = "0017_bucket_ranges"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"activity_hour_packed": "hour", "activity_day_packed": "day"}


def upgrade() -> None:
    for table, bucket in INDEXES.items():
        op.create_index(op.f(f"ix_{table}_workload_{bucket}"), table, ["workload", bucket])


def downgrade() -> None:
    for table, bucket in INDEXES.items():
        op.drop_index(op.f(f"ix_{table}_workload_{bucket}"), table_name=table)
