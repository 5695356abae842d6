"""trace_gpu.verdict holds 32 characters

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 10:30:00.000000

``gpu-profiler trace`` names a new verdict, ``communication-bound`` (19 characters), longer
than the 16 the column held. Widening a varchar keeps every stored value (PostgreSQL changes
only the column's limit; SQLite ignores lengths, so its table is copied unchanged).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trace_gpu") as table:
        table.alter_column(
            "verdict",
            existing_type=sa.String(length=16),
            type_=sa.String(length=32),
            existing_nullable=False,
        )


def downgrade() -> None:
    # Verdicts longer than 16 characters are cut to fit (communication-bound).
    op.execute("UPDATE trace_gpu SET verdict = substr(verdict, 1, 16) WHERE length(verdict) > 16")
    with op.batch_alter_table("trace_gpu") as table:
        table.alter_column(
            "verdict",
            existing_type=sa.String(length=32),
            type_=sa.String(length=16),
            existing_nullable=False,
        )
