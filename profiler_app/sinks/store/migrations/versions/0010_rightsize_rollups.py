"""Right-sizing's rollups: rightsize_hour, rightsize_day (covered time, peaks, first and last
moment, GPU model and MIG profile per GPU, workload and bucket) and activity_hour, activity_day
(histograms of SM and DRAM activity in 1 %-wide buckets); on PostgreSQL partitioned by month

Revision ID: 0010_rightsize_rollups
Revises: 0009_gpu_identity
Create Date: 2026-11-29 04:00:00.000000

Filled from the raw rows still kept, by the rules the writer follows (``sinks/store/
activity.py``, restated here in SQL: revisions do not import the package): only rows of a pod;
the workload is the owner's name, else the pod's; each row's covered time ``(at -
covers_seconds, at]``, in whole microseconds, is split over the buckets it spans (a row covering
nothing belongs to the bucket of its ``at``); a ratio's bucket is ``floor(ratio * 100 + 1e-9)``
within 0..100. Where the rows of one bucket name several GPU models or MIG profiles the largest
name is kept (the writer keeps the latest).

Downgrade: the four tables are dropped; the raw rows and other rollups are untouched.
"""

# SQL here is built from the revision's own constant table and column names; no values.
# ruff: noqa: S608

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0010_rightsize_rollups"
down_revision: str | None = "0009_gpu_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLUP_FILLFACTOR = 70
TIERS = {"hour": 3600, "day": 86400}
METRICS = {"sm": "sm_active_p95", "sm_mean": "sm_active_mean", "dram": "dram_active_p95"}
KEY = "node, gpu, uuid, gpu_i_id, namespace, workload"


def _key(bucket: str) -> list[sa.Column[object]]:
    return [
        sa.Column(bucket, sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu", sa.String(length=32), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("gpu_i_id", sa.String(length=8), nullable=False, server_default=""),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("workload", sa.String(length=253), nullable=False),
    ]


def _create_tables(bucket: str) -> None:
    key = (bucket, *KEY.split(", "))
    op.create_table(
        f"rightsize_{bucket}",
        *_key(bucket),
        sa.Column("covered_seconds", sa.Float(), nullable=False),
        sa.Column("idle_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("fb_used_max_mib", sa.Float(), nullable=True),
        sa.Column("covers_max_seconds", sa.Float(), nullable=False),
        sa.Column("first_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_covered_seconds", sa.Float(), nullable=False),
        sa.Column("gpu_model", sa.String(length=256), nullable=True),
        sa.Column("mig_profile", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint(*key, name=op.f(f"pk_rightsize_{bucket}")),
        postgresql_partition_by=f"RANGE ({bucket})",
    )
    op.create_table(
        f"activity_{bucket}",
        *_key(bucket),
        sa.Column("metric", sa.String(length=8), nullable=False),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(*key, "metric", "percent", name=op.f(f"pk_activity_{bucket}")),
        postgresql_partition_by=f"RANGE ({bucket})",
    )


# -- SQL of one dialect ------------------------------------------------------------------------


def _end_us(postgresql: bool) -> str:
    if postgresql:
        return "round(date_part('epoch', at) * 1000000)::bigint"
    # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff': whole seconds (from the text before the
    # fraction: strftime rounds milliseconds, so :19.9999 would read :20), then the microseconds.
    return (
        "(CAST(strftime('%s', substr(at, 1, 19)) AS INTEGER) * 1000000"
        " + CAST(substr(at, 21, 6) AS INTEGER))"
    )


def _time(postgresql: bool, microseconds: str) -> str:
    """The timestamp of a count of microseconds since the epoch, as each backend stores it."""
    if postgresql:
        return f"(timestamptz 'epoch' + ({microseconds}) * interval '1 microsecond')"
    return (
        f"strftime('%Y-%m-%d %H:%M:%S', ({microseconds}) / 1000000, 'unixepoch')"
        f" || '.' || printf('%06d', ({microseconds}) % 1000000)"
    )


def _percent(postgresql: bool, column: str) -> str:
    whole = (
        f"floor({column} * 100 + 1e-9)::integer"
        if postgresql
        else (f"CAST({column} * 100 + 1e-9 AS INTEGER)")
    )
    return f"CASE WHEN {column} >= 1 THEN 100 WHEN {column} <= 0 THEN 0 ELSE {whole} END"


def _pieces(postgresql: bool, seconds: int) -> str:
    """Each raw row of a pod once per bucket it covers: ``b`` (bucket number), ``piece``
    (seconds inside it), ``low_us`` and ``high_us`` (the part's start and end)."""
    size = seconds * 1_000_000
    spans = (
        "SELECT gpu_window.*, end_us - covers_us AS start_us,"
        f" CASE WHEN covers_us > 0 THEN (end_us - covers_us) / {size} ELSE end_us / {size} END"
        " AS first_b,"
        f" CASE WHEN covers_us > 0 THEN (end_us - 1) / {size} ELSE end_us / {size} END AS last_b"
        f" FROM (SELECT gpu_window.*, {_end_us(postgresql)} AS end_us,"
        " CAST(round(covers_seconds * 1000000) AS BIGINT) AS covers_us FROM gpu_window"
        " WHERE pod IS NOT NULL) AS gpu_window"
    )
    high = f"CASE WHEN end_us < (b + 1) * {size} THEN end_us ELSE (b + 1) * {size} END"
    low = f"CASE WHEN start_us > b * {size} THEN start_us ELSE b * {size} END"
    parts = f"{high} AS high_us, {low} AS low_us, ({high} - {low}) / 1000000.0 AS piece"
    if postgresql:
        numbered = (
            f"SELECT spans.*, b FROM ({spans}) AS spans,"
            " LATERAL generate_series(first_b, last_b) AS b"
        )
    else:
        numbered = (
            f"SELECT spans.*, first_b + steps.i AS b FROM ({spans}) AS spans"
            " JOIN steps ON steps.i <= last_b - first_b"
        )
    return (
        f"SELECT numbered.*, {parts}, coalesce(namespace, '') AS namespace_key,"
        " coalesce(nullif(owner_name, ''), pod) AS workload_key"
        f" FROM ({numbered}) AS numbered"
    )


def _steps(postgresql: bool, seconds: int) -> str:
    """SQLite: the recursive count 0..(most buckets a row spans - 1), as a WITH clause."""
    if postgresql:
        return ""
    size = seconds * 1_000_000
    most = (
        op.get_bind()
        .exec_driver_sql(
            f"SELECT max(CAST(round(covers_seconds * 1000000) AS INTEGER) / {size} + 1)"
            " FROM gpu_window"
        )
        .scalar()
    )
    return (
        "WITH RECURSIVE steps(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM steps"
        f" WHERE i < {int(most or 0)}) "
    )


def _fill(postgresql: bool, bucket: str, seconds: int) -> None:
    start = _time(postgresql, f"b * {seconds * 1_000_000}")
    keys = "node, gpu, uuid, gpu_i_id, namespace_key, workload_key"
    pieces = _pieces(postgresql, seconds)
    op.execute(
        f"{_steps(postgresql, seconds)}"
        f"INSERT INTO rightsize_{bucket} ({bucket}, {KEY}, covered_seconds, idle_gpu_seconds,"
        " util_max, fb_used_max_mib, covers_max_seconds, first_start, last_end,"
        " period_covered_seconds, gpu_model, mig_profile)"
        f" SELECT {start}, {keys}, sum(piece), sum(piece * coalesce(util_idle_fraction, 0)),"
        " max(util_max), max(fb_used_max_mib), max(covers_seconds),"
        f" {_time(postgresql, 'min(low_us)')}, {_time(postgresql, 'max(high_us)')},"
        " sum(CASE WHEN job_type = 'training' AND period_seconds IS NOT NULL"
        " THEN piece ELSE 0 END), max(gpu_model), max(mig_profile)"
        f" FROM ({pieces}) AS pieces GROUP BY b, {keys}"
    )
    binned = " UNION ALL ".join(
        f"SELECT b, {keys}, '{metric}' AS metric, {_percent(postgresql, column)} AS percent,"
        f" piece FROM ({pieces}) AS pieces WHERE {column} IS NOT NULL AND piece > 0"
        for metric, column in METRICS.items()
    )
    op.execute(
        f"{_steps(postgresql, seconds)}"
        f"INSERT INTO activity_{bucket} ({bucket}, {KEY}, metric, percent, seconds)"
        f" SELECT {start}, {keys}, metric, percent, sum(piece) FROM ({binned}) AS binned"
        f" GROUP BY b, {keys}, metric, percent"
    )


# -- PostgreSQL partitions ---------------------------------------------------------------------


def _months(first: datetime, last: datetime) -> list[datetime]:
    month = datetime(first.year, first.month, 1, tzinfo=UTC)
    months = []
    while month <= last:
        months.append(month)
        month = (month + timedelta(days=32)).replace(day=1)
    return months


def _partition(bucket: str) -> None:
    """Monthly partitions for the existing rows' buckets, this month and the next (the writer
    adds later ones)."""
    now = datetime.now(UTC)
    months = set(_months(now, now.replace(day=1) + timedelta(days=32)))
    first, last, longest = (
        op.get_bind()
        .exec_driver_sql("SELECT min(at), max(at), max(covers_seconds) FROM gpu_window")
        .one()
    )
    if first is not None:
        start = first.astimezone(UTC) - timedelta(seconds=float(longest or 0.0))
        months.update(_months(start, last.astimezone(UTC)))
    for table in (f"rightsize_{bucket}", f"activity_{bucket}"):
        for month in sorted(months):
            upper = (month + timedelta(days=32)).replace(day=1)
            name = f"{table}_p{month:%Y%m}"
            op.execute(
                f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                f" WITH (fillfactor = {ROLLUP_FILLFACTOR})"
            )
            op.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES"
                f" FROM ('{month:%Y-%m-%d %H:%M:%S}+00') TO ('{upper:%Y-%m-%d %H:%M:%S}+00')"
            )


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for bucket, seconds in TIERS.items():
        _create_tables(bucket)
        if postgresql:
            _partition(bucket)
        _fill(postgresql, bucket, seconds)


def downgrade() -> None:
    for bucket in reversed(TIERS):
        op.drop_table(f"activity_{bucket}")
        op.drop_table(f"rightsize_{bucket}")
