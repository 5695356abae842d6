"""gpu_hour and gpu_day: an index on the workload's name and the bucket, for waste's GPU counts

Revision ID: 0014_workload_indexes
Revises: 0013_gpu_job_day
Create Date: 2026-11-30 15:00:00.000000

``report --by waste`` over days ranks the workloads, then counts the GPUs of the listed ones
(about thirty) in ``gpu_hour`` and ``gpu_day``. Their keys start with the bucket and the GPU,
so that count read every row of the range: 0.45-0.56 s over 30 days of the 8,500-GPU
benchmark store, against 0.19-0.28 s with these indexes (benchmarks/RESULTS.md).

Upgrade: ``(owner_name, hour)`` on ``gpu_hour`` and ``(owner_name, day)`` on ``gpu_day``. On
PostgreSQL the index is made on the partitioned table, so every partition has it and the
partitions the writer attaches later get it. Building it blocks writes to the table (not
reads) for as long as it takes: 11 s for the benchmark store's 35 days of a thousand nodes;
the writers wait, then commit.

Downgrade: the indexes are dropped.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014_workload_indexes"
down_revision: str | None = "0013_gpu_job_day"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"gpu_hour": "hour", "gpu_day": "day"}


def upgrade() -> None:
    for table, bucket in INDEXES.items():
        op.create_index(op.f(f"ix_{table}_owner_name_{bucket}"), table, ["owner_name", bucket])


def downgrade() -> None:
    for table, bucket in INDEXES.items():
        op.drop_index(op.f(f"ix_{table}_owner_name_{bucket}"), table_name=table)
