"""idle_block and idle_block_made: idle time per workload over blocks of whole days

Revision ID: 0015_idle_blocks
Revises: 0014_workload_indexes
Create Date: 2026-11-30 20:30:00.000000

``report --by waste`` over 30 days ranks about 200,000 workloads of the 8,500-GPU benchmark
store from 1.6 million ``gpu_day`` rows: a workload runs about six days on a node, so one row
per day and workload is most of the cost. ``idle_block`` sums the idle time of a workload over
a block of 2, 4, 8 or 16 whole days aligned on the epoch; a month is a few blocks and
the days left over (benchmarks/RESULTS.md).

Upgrade: both tables, empty. The writer makes the blocks of settled days from ``gpu_day``
(``idle_blocks.py``), a bounded number per call, so a store's existing days are filled over the
following hours; until a block is made the report reads its days from ``gpu_day``.

Downgrade: both tables are dropped; nothing else is touched.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_idle_blocks"
down_revision: str | None = "0014_workload_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idle_block",
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("memory_held", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("has_pod", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("owner_kind", sa.String(length=63), nullable=False),
        sa.Column("owner_name", sa.String(length=253), nullable=False),
        sa.Column("idle_gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "start",
            "days",
            "memory_held",
            "has_pod",
            "namespace",
            "owner_kind",
            "owner_name",
            name=op.f("pk_idle_block"),
        ),
    )
    op.create_table(
        "idle_block_made",
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("made_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("start", "days", name=op.f("pk_idle_block_made")),
    )


def downgrade() -> None:
    op.drop_table("idle_block_made")
    op.drop_table("idle_block")
