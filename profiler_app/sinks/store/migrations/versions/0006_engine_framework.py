"""Engine and framework of each GPU window

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 10:00:00.000000

What ran on the GPU (profiler_app.profiles.engines): the engine (vllm, torchrun, ...) and the
framework (pytorch, jax, ...). Additive: rows written before this revision have NULL in both.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gpu_window") as table:
        table.add_column(sa.Column("engine", sa.String(length=32), nullable=True))
        table.add_column(sa.Column("framework", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_window") as table:
        table.drop_column("framework")
        table.drop_column("engine")
