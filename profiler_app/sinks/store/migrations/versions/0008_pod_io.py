"""Pods' disk and network rates

Revision ID: 0008_pod_io
Revises: 0007_rollups
Create Date: 2026-11-26 14:00:00.000000

``pod_usage`` gains each direction's (disk read and write, network receive and transmit) peak
and 95th percentile in bytes per second, and whether the pod's network could be told from the
host's; ``pod_hour`` the peaks. Additive: rows written before have NULL in all of them. On
PostgreSQL ``pod_hour`` is partitioned: a column added to the parent reaches every partition.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_pod_io"
down_revision: str | None = "0007_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DIRECTIONS = ("disk_read", "disk_write", "network_receive", "network_transmit")


def _columns(statistics: tuple[str, ...]) -> list[str]:
    return [f"{d}_bytes_per_second_{s}" for d in DIRECTIONS for s in statistics]


def upgrade() -> None:
    with op.batch_alter_table("pod_usage") as table:
        for name in _columns(("max", "p95")):
            table.add_column(sa.Column(name, sa.Float(), nullable=True))
        table.add_column(
            sa.Column("network_attributable", sa.Boolean(create_constraint=False), nullable=True)
        )
    for name in _columns(("max",)):
        # Not batch: pod_hour is partitioned on PostgreSQL, and SQLite adds a column in place.
        op.add_column("pod_hour", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in reversed(_columns(("max",))):
        op.drop_column("pod_hour", name)
    with op.batch_alter_table("pod_usage") as table:
        table.drop_column("network_attributable")
        for name in reversed(_columns(("max", "p95"))):
            table.drop_column(name)
