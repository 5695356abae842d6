"""Create trial_result

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 10:40:00.000000

One row per trial of a ``gpu-profiler trial run``: the placement, its outcome and throughput,
keyed by run and trial. Additive: no existing table changes.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "trial_result",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("trial", sa.String(length=253), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("workload", sa.String(length=512), nullable=False),
        sa.Column("placement", sa.String(length=256), nullable=False),
        sa.Column("gpu_model", sa.String(length=256), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpus_per_pod", sa.Integer(), nullable=False),
        sa.Column("pods", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("layout", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("estimator", sa.String(length=16), nullable=True),
        sa.Column("throughput", sa.Float(), nullable=True),
        sa.Column("unit", sa.String(length=64), nullable=True),
        sa.Column("throughput_per_gpu", sa.Float(), nullable=True),
        sa.Column("scaling_efficiency", sa.Float(), nullable=True),
        sa.Column("step_seconds", sa.Float(), nullable=True),
        sa.Column("peak_fb_mib", sa.Float(), nullable=True),
        sa.Column("sm_active", sa.Float(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("pareto", sa.Boolean(), nullable=False),
        sa.Column("recommended", sa.Boolean(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("recommendation", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "trial", name=op.f("pk_trial_result")),
    )
    op.create_index(
        op.f("ix_trial_result_recorded_at"), "trial_result", ["recorded_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_trial_result_recorded_at"), table_name="trial_result")
    op.drop_table("trial_result")
