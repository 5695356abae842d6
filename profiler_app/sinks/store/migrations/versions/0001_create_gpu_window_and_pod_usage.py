"""Create gpu_window and pod_usage

Revision ID: 0001
Revises: -
Create Date: 2026-11-22 02:53:07.032108

Timestamps are UTC (timestamptz on PostgreSQL, naive UTC text on SQLite).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gpu_window",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu", sa.String(length=32), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("job_type", sa.String(length=16), nullable=False),
        sa.Column("period_seconds", sa.Float(), nullable=True),
        sa.Column("window_seconds", sa.Float(), nullable=False),
        sa.Column("covers_seconds", sa.Float(), nullable=False),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("util_p95", sa.Float(), nullable=True),
        sa.Column("util_mean", sa.Float(), nullable=True),
        sa.Column("util_idle_fraction", sa.Float(), nullable=True),
        sa.Column("mem_util_max", sa.Float(), nullable=True),
        sa.Column("fb_used_max_mib", sa.Float(), nullable=True),
        sa.Column("namespace", sa.String(length=253), nullable=True),
        sa.Column("pod", sa.String(length=253), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_window")),
    )
    op.create_index(op.f("ix_gpu_window_at"), "gpu_window", ["at"], unique=False)
    op.create_index(
        op.f("ix_gpu_window_node_gpu_at"), "gpu_window", ["node", "gpu", "at"], unique=False
    )
    op.create_table(
        "pod_usage",
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("pod_start_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.String(length=256), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_util_max", sa.Float(), nullable=True),
        sa.Column("gpu_mem_util_max", sa.Float(), nullable=True),
        sa.Column("fb_used_max_mib", sa.Float(), nullable=True),
        sa.Column("cpu_util_max", sa.Float(), nullable=True),
        sa.Column("mem_used_max_bytes", sa.Float(), nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "namespace", "pod", "node", "pod_start_time", name=op.f("pk_pod_usage")
        ),
    )
    op.create_index(op.f("ix_pod_usage_last_seen"), "pod_usage", ["last_seen"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_pod_usage_last_seen"), table_name="pod_usage")
    op.drop_table("pod_usage")
    op.drop_index(op.f("ix_gpu_window_node_gpu_at"), table_name="gpu_window")
    op.drop_index(op.f("ix_gpu_window_at"), table_name="gpu_window")
    op.drop_table("gpu_window")
