"""gpu_hour and gpu_day: a BRIN index on the bucket (PostgreSQL)

Revision ID: 0017_bucket_ranges
Revises: 0016_idle_block_gpus
Create Date: 2026-12-01 02:20:00.000000

A report over 30 days reads the hours of its first day from that month's ``gpu_hour``
partition, and ``waste`` the days since the last idle block from ``gpu_day``'s. The key's
B-tree finds them, but PostgreSQL 15 costs that read as random pages and scans the whole
partition instead: 46,700 pages of ``gpu_hour`` for 16 hours of the 8,500-GPU benchmark store,
51,600 of ``gpu_day`` for 3 days. The writer appends buckets in time order, so a BRIN index on
the bucket (each range of 128 pages: its first and last bucket) finds them in a few ranges:
7,100 and 6,400 pages (benchmarks/RESULTS.md).

Upgrade: on PostgreSQL, ``ix_gpu_hour_hour`` and ``ix_gpu_day_day``, BRIN, with
``autosummarize`` (autovacuum summarises the ranges filled since; one not summarised yet is
read whole). Made on the partitioned table, so every partition has it and those attached later
get it. Building it reads each table once and blocks writes to it meanwhile: 2.6 s for the
benchmark store (2.8 GB in the two tables). SQLite has no BRIN: nothing to do there.

Downgrade: the indexes are dropped.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017_bucket_ranges"
down_revision: str | None = "0016_idle_block_gpus"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"gpu_hour": "hour", "gpu_day": "day"}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, bucket in INDEXES.items():
        op.create_index(
            op.f(f"ix_{table}_{bucket}"),
            table,
            [bucket],
            postgresql_using="brin",
            postgresql_with={"autosummarize": "on"},
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, bucket in INDEXES.items():
        op.drop_index(op.f(f"ix_{table}_{bucket}"), table_name=table)
