"""Create trace_gpu

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 07:20:38.480842

One row per GPU per Nsight Systems report summarised by ``gpu-profiler trace``, keyed by pod,
node and the report's capture start. Timestamps are UTC (timestamptz on PostgreSQL, naive UTC
text on SQLite).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "trace_gpu",
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("device", sa.Integer(), nullable=False),
        sa.Column("report", sa.String(length=1024), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_name", sa.String(length=256), nullable=True),
        sa.Column("uuid", sa.String(length=64), nullable=True),
        sa.Column("span_seconds", sa.Float(), nullable=False),
        sa.Column("busy_fraction", sa.Float(), nullable=False),
        sa.Column("idle_gap_count", sa.BigInteger(), nullable=False),
        sa.Column("idle_total_seconds", sa.Float(), nullable=False),
        sa.Column("idle_longest_seconds", sa.Float(), nullable=False),
        sa.Column("kernel_count", sa.BigInteger(), nullable=False),
        sa.Column("kernel_seconds", sa.Float(), nullable=False),
        sa.Column("memory_seconds", sa.Float(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("pageable_seconds", sa.Float(), nullable=False),
        sa.Column("launch_api_seconds", sa.Float(), nullable=False),
        sa.Column("sync_api_seconds", sa.Float(), nullable=False),
        sa.Column("iteration_seconds", sa.Float(), nullable=True),
        sa.Column("profiler_period_seconds", sa.Float(), nullable=True),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("top_kernel", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint(
            "namespace", "pod", "node", "started_at", "device", name=op.f("pk_trace_gpu")
        ),
    )
    op.create_index(op.f("ix_trace_gpu_started_at"), "trace_gpu", ["started_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_trace_gpu_started_at"), table_name="trace_gpu")
    op.drop_table("trace_gpu")
