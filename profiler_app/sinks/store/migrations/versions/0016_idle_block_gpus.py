"""idle_block_gpu: the GPUs of the idle blocks' workloads without an owner name

Revision ID: 0016_idle_block_gpus
Revises: 0015_idle_blocks
Create Date: 2026-11-30 23:30:00.000000

``report --by waste`` counts the GPUs of the workloads it lists. A workload without an owner
name (GPUs with no pod: one group, which holds most of a cluster's GPUs over a month; or pods
without a controller) has ``''`` there, so the index on the owner's name finds all of
``gpu_day``'s rows of those: 199,000 of a month's in the 8,500-GPU benchmark store, two
thirds of the listed workloads' count. ``idle_block_gpu`` keeps, for each idle block, those
workloads' idle seconds per GPU: a few thousand rows a block.

Upgrade: the table, filled for the blocks already made (``idle_block_made``) from ``gpu_day``,
as the writer makes a 2-day block; a made block always has both its tables' rows.

Downgrade: the table is dropped; nothing else is touched.
"""

from collections.abc import Sequence
from datetime import UTC, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0016_idle_block_gpus"
down_revision: str | None = "0015_idle_blocks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = ("memory_held", "has_pod", "namespace", "owner_kind", "node", "uuid", "gpu_i_id")
_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "idle_block_gpu",
        sa.Column("start", _TIME, nullable=False),
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("memory_held", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("has_pod", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("owner_kind", sa.String(length=63), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("gpu_i_id", sa.String(length=8), nullable=False),
        sa.Column("idle_gpu_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("start", "days", *KEY, name=op.f("pk_idle_block_gpu")),
    )
    bind = op.get_bind()
    made = sa.table("idle_block_made", sa.column("start", _TIME), sa.column("days", sa.Integer))
    keys = ", ".join(KEY)
    fill = sa.text(
        f"INSERT INTO idle_block_gpu (start, days, {keys}, idle_gpu_seconds)"  # noqa: S608
        f" SELECT :start, :days, {keys}, sum(idle_gpu_seconds) FROM gpu_day"
        " WHERE day >= :start AND day < :end AND idle_gpu_seconds > 0 AND owner_name = ''"
        f" GROUP BY {keys}"
    ).bindparams(sa.bindparam("start", type_=_TIME), sa.bindparam("end", type_=_TIME))
    sqlite = bind.dialect.name == "sqlite"
    for stored, days in bind.execute(sa.select(made.c.start, made.c.days)).all():
        # SQLite keeps naive UTC text, as the store writes it; PostgreSQL an aware time.
        start = stored.replace(tzinfo=None) if sqlite else stored.astimezone(UTC)
        bind.execute(fill, {"start": start, "days": days, "end": start + timedelta(days=days)})


def downgrade() -> None:
    op.drop_table("idle_block_gpu")
