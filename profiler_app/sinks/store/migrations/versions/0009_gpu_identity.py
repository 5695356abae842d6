"""GPU identity by MIG instance: gpu_window's gpu_i_id, mig_profile, gpu_model, sharing and
replicas; the GPU rollups keyed by MIG instance too; pod_usage's gpu_attribution

Revision ID: 0009_gpu_identity
Revises: 0007_rollups
Create Date: 2026-11-26 14:00:00.000000

A GPU is (node, UUID, MIG instance): dcgm-exporter labels every MIG instance with its parent's
UUID and index and adds ``GPU_I_ID``. ``gpu_i_id`` is '' for a whole GPU (every row written
before this revision), so it joins the keys of ``gpu_hour`` and ``gpu_day`` without NULLs.
``sharing`` is none, time-slicing or mps (NULL: not known), ``replicas`` the GPU's share count.
pod_usage's ``gpu_attribution`` says where a pod's GPU peaks on a shared GPU come from ("shared:
per pod", "shared: not attributable"; NULL: its GPUs are its own). ``sm_active_p95``,
``sm_active_mean`` and ``dram_active_p95`` are what right-sizing reads (ratios, NULL where the
fields were not read).

Downgrade: the rollups' rows of MIG instances are removed (a key without the instance would
merge seven GPUs into one); gpu_window keeps its rows, less the new columns.
"""

# SQL here is built from the revision's own constant table and column names; no values.
# ruff: noqa: S608

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_gpu_identity"
down_revision: str | None = "0008_pod_io"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_BEFORE = (
    "node",
    "gpu",
    "uuid",
    "job_type",
    "memory_held",
    "namespace",
    "pod",
    "owner_kind",
    "owner_name",
)
# What right-sizing reads (report --by rightsize): SM and DRAM activity per window, ratios 0-1.
RIGHTSIZING_COLUMNS = ("sm_active_p95", "sm_active_mean", "dram_active_p95")
ROLLUPS = {
    "gpu_hour": ("hour", KEY_BEFORE),
    "gpu_day": ("day", tuple("has_pod" if c == "pod" else c for c in KEY_BEFORE)),
}


def _with_instance(key: tuple[str, ...]) -> tuple[str, ...]:
    position = key.index("uuid") + 1
    return (*key[:position], "gpu_i_id", *key[position:])


def _instance_column() -> sa.Column[str]:
    return sa.Column("gpu_i_id", sa.String(length=8), nullable=False, server_default="")


def _rekey(name: str, columns: tuple[str, ...]) -> None:
    """The rollup's primary key made of ``columns``."""
    if op.get_bind().dialect.name == "postgresql":  # partitioned: the key spans the partitions
        op.execute(f"ALTER TABLE {name} DROP CONSTRAINT pk_{name}")
        op.execute(
            f"ALTER TABLE {name} ADD CONSTRAINT pk_{name} PRIMARY KEY ({', '.join(columns)})"
        )
        return
    with op.batch_alter_table(name, recreate="always") as table:
        table.drop_constraint(f"pk_{name}", type_="primary")
        table.create_primary_key(f"pk_{name}", list(columns))


def upgrade() -> None:
    with op.batch_alter_table("gpu_window") as table:
        table.add_column(_instance_column())
        table.add_column(sa.Column("mig_profile", sa.String(length=32), nullable=True))
        table.add_column(sa.Column("gpu_model", sa.String(length=256), nullable=True))
        table.add_column(sa.Column("sharing", sa.String(length=16), nullable=True))
        table.add_column(sa.Column("replicas", sa.Integer(), nullable=True))
        for column in RIGHTSIZING_COLUMNS:
            table.add_column(sa.Column(column, sa.Float(), nullable=True))
    for name, (bucket, key) in ROLLUPS.items():
        with op.batch_alter_table(name) as table:
            table.add_column(_instance_column())
        _rekey(name, (bucket, *_with_instance(key)))
    with op.batch_alter_table("pod_usage") as table:
        table.add_column(sa.Column("gpu_attribution", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pod_usage") as table:
        table.drop_column("gpu_attribution")
    for name, (bucket, key) in ROLLUPS.items():
        op.execute(f"DELETE FROM {name} WHERE gpu_i_id <> ''")
        _rekey(name, (bucket, *key))
        with op.batch_alter_table(name) as table:
            table.drop_column("gpu_i_id")
    with op.batch_alter_table("gpu_window") as table:
        for column in (
            *reversed(RIGHTSIZING_COLUMNS),
            "replicas",
            "sharing",
            "gpu_model",
            "mig_profile",
            "gpu_i_id",
        ):
            table.drop_column(column)
