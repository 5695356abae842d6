"""Confidence, basis, reasons and workload of each GPU window; workload of each pod; memory-copy
columns renamed

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 08:30:00.000000

The memory-copy columns carry DCGM_FI_DEV_MEM_COPY_UTIL, memory bandwidth, not occupancy:
``gpu_window.mem_util_max`` becomes ``mem_copy_util_max`` and ``pod_usage.gpu_mem_util_max``
becomes ``gpu_mem_copy_util_max`` (renamed in place: stored values are kept). The new columns
are NULL on rows written before this revision.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_window") as table:
        table.alter_column("mem_util_max", new_column_name="mem_copy_util_max")
        table.add_column(sa.Column("confidence", sa.Float(), nullable=True))
        table.add_column(sa.Column("basis", sa.String(length=16), nullable=True))
        table.add_column(sa.Column("reasons", sa.String(length=512), nullable=True))
        table.add_column(sa.Column("owner_kind", sa.String(length=63), nullable=True))
        table.add_column(sa.Column("owner_name", sa.String(length=253), nullable=True))
    with op.batch_alter_table("pod_usage") as table:
        table.alter_column("gpu_mem_util_max", new_column_name="gpu_mem_copy_util_max")
        table.add_column(sa.Column("owner_kind", sa.String(length=63), nullable=True))
        table.add_column(sa.Column("owner_name", sa.String(length=253), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pod_usage") as table:
        table.drop_column("owner_name")
        table.drop_column("owner_kind")
        table.alter_column("gpu_mem_copy_util_max", new_column_name="gpu_mem_util_max")
    with op.batch_alter_table("gpu_window") as table:
        table.drop_column("owner_name")
        table.drop_column("owner_kind")
        table.drop_column("reasons")
        table.drop_column("basis")
        table.drop_column("confidence")
        table.alter_column("mem_copy_util_max", new_column_name="mem_util_max")
