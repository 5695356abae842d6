"""Hourly and daily rollups (gpu_hour, gpu_day, pod_hour), store_horizon; on PostgreSQL
gpu_window partitioned by day and the rollups by month

Revision ID: 0007_rollups
Revises: 0006
Create Date: 2026-11-26 10:00:00.000000

The rollups are filled from the existing rows, by the rules the writer follows
(``sinks/store/rollups.py``, restated here in SQL: revisions do not import the package): each
row's covered time ``(at - covers_seconds, at]``, in whole microseconds, is split over the
buckets it spans; a row covering nothing belongs to the bucket of its ``at``; text keys are ''
when unknown; memory counts as held from 1024 MiB; gpu_day records whether a pod held the GPU,
not which. Rows written before have no pod CPU or
memory peaks per hour: pod_hour's ``cpu_util_max`` and ``mem_used_max_bytes`` stay NULL there.

On PostgreSQL ``gpu_window`` becomes a table partitioned by UTC day (``gpu_window_pYYYYMMDD``,
primary key ``(id, at)``, its id sequence kept): its rows are copied into the new partitions,
in this one transaction. The downgrade copies them back into a plain table.
"""

# SQL here is built from the revision's own constant table and column names; no values.
# ruff: noqa: S608

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "0007_rollups"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HELD_MEMORY_MIB = 1024  # profiler_app.core.model.HELD_MEMORY_MIB when this revision was written
ROLLUP_FILLFACTOR = 70
GPU_HOUR_KEY = (
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
# gpu_day: whether a pod held the GPU, not which.
GPU_DAY_KEY = tuple("has_pod" if column == "pod" else column for column in GPU_HOUR_KEY)
GPU_ROLLUPS = {"gpu_hour": ("hour", 3600, GPU_HOUR_KEY), "gpu_day": ("day", 86400, GPU_DAY_KEY)}


def _gpu_rollup(name: str, bucket: str, key: tuple[str, ...]) -> None:
    pod = (
        sa.Column("pod", sa.String(length=253), nullable=False)
        if "pod" in key
        else sa.Column("has_pod", sa.Boolean(create_constraint=False), nullable=False)
    )
    op.create_table(
        name,
        sa.Column(bucket, sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("gpu", sa.String(length=32), nullable=False),
        sa.Column("uuid", sa.String(length=64), nullable=False),
        sa.Column("job_type", sa.String(length=16), nullable=False),
        sa.Column("memory_held", sa.Boolean(create_constraint=False), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        pod,
        sa.Column("owner_kind", sa.String(length=63), nullable=False),
        sa.Column("owner_name", sa.String(length=253), nullable=False),
        sa.Column("covered_seconds", sa.Float(), nullable=False),
        sa.Column("idle_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("mem_copy_util_max", sa.Float(), nullable=True),
        sa.Column("fb_used_max_mib", sa.Float(), nullable=True),
        sa.Column("covers_max_seconds", sa.Float(), nullable=False),
        sa.Column("period_seconds_min", sa.Float(), nullable=True),
        sa.Column("period_seconds_max", sa.Float(), nullable=True),
        sa.Column("period_covered_seconds", sa.Float(), nullable=False),
        sa.Column("period_weighted_sum", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(bucket, *key, name=op.f(f"pk_{name}")),
        postgresql_partition_by=f"RANGE ({bucket})",
    )


def _create_tables() -> None:
    for name, (bucket, _, key) in GPU_ROLLUPS.items():
        _gpu_rollup(name, bucket, key)
    op.create_table(
        "pod_hour",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("owner_kind", sa.String(length=63), nullable=True),
        sa.Column("owner_name", sa.String(length=253), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("idle_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("mem_copy_util_max", sa.Float(), nullable=True),
        sa.Column("fb_used_max_mib", sa.Float(), nullable=True),
        sa.Column("cpu_util_max", sa.Float(), nullable=True),
        sa.Column("mem_used_max_bytes", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("hour", "node", "namespace", "pod", name=op.f("pk_pod_hour")),
        postgresql_partition_by="RANGE (hour)",
    )
    op.create_table(
        "store_horizon",
        sa.Column("table_name", sa.String(length=63), nullable=False),
        sa.Column("removed_before", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("table_name", name=op.f("pk_store_horizon")),
    )


# -- SQL of one dialect: a row's end and start in microseconds, a bucket's start time --------


def _end_us(postgresql: bool) -> str:
    if postgresql:
        return "round(date_part('epoch', at) * 1000000)::bigint"
    # SQLite stores 'YYYY-MM-DD HH:MM:SS.ffffff': whole seconds (from the text before the
    # fraction: strftime rounds milliseconds, so :19.9999 would read :20), then the microseconds.
    return (
        "(CAST(strftime('%s', substr(at, 1, 19)) AS INTEGER) * 1000000"
        " + CAST(substr(at, 21, 6) AS INTEGER))"
    )


def _bucket_time(postgresql: bool, seconds: int) -> str:
    if postgresql:
        return f"to_timestamp(b * {seconds})"
    return f"strftime('%Y-%m-%d %H:%M:%S', b * {seconds}, 'unixepoch') || '.000000'"


def _pieces(postgresql: bool, seconds: int, where: str = "") -> str:
    """Each raw row once per bucket it covers, with ``b`` (bucket number) and ``piece``
    (seconds inside it). SQLite has no generate_series: a recursive count stands in."""
    size = seconds * 1_000_000
    spans = (
        "SELECT gpu_window.*, end_us - covers_us AS start_us,"
        f" CASE WHEN covers_us > 0 THEN (end_us - covers_us) / {size} ELSE end_us / {size} END"
        " AS first_b,"
        f" CASE WHEN covers_us > 0 THEN (end_us - 1) / {size} ELSE end_us / {size} END AS last_b"
        f" FROM (SELECT gpu_window.*, {_end_us(postgresql)} AS end_us,"
        " CAST(round(covers_seconds * 1000000) AS BIGINT) AS covers_us FROM gpu_window"
        f" {where}) AS gpu_window"
    )
    piece = (
        f"(CASE WHEN end_us < (b + 1) * {size} THEN end_us ELSE (b + 1) * {size} END"
        f" - CASE WHEN start_us > b * {size} THEN start_us ELSE b * {size} END) / 1000000.0"
    )
    if postgresql:
        return (
            f"SELECT spans.*, b, {piece} AS piece FROM ({spans}) AS spans,"
            " LATERAL generate_series(first_b, last_b) AS b"
        )
    return (
        f"SELECT spans.*, {piece} AS piece FROM (SELECT spans.*, first_b + steps.i AS b"
        f" FROM ({spans}) AS spans JOIN steps ON steps.i <= last_b - first_b) AS spans"
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


def _fill_gpu_rollup(
    postgresql: bool, name: str, bucket: str, seconds: int, key: tuple[str, ...]
) -> None:
    false = "false" if postgresql else "0"
    pod = "coalesce(pod, '')" if "pod" in key else "pod IS NOT NULL"
    keys = (
        "node, gpu, uuid, job_type,"
        f" coalesce(fb_used_max_mib >= {HELD_MEMORY_MIB}, {false}),"
        f" coalesce(namespace, ''), {pod},"
        " coalesce(owner_kind, ''), coalesce(owner_name, '')"
    )
    op.execute(
        f"{_steps(postgresql, seconds)}"
        f"INSERT INTO {name} ({bucket}, {', '.join(key)}, covered_seconds,"
        " idle_gpu_seconds, util_max, mem_copy_util_max, fb_used_max_mib, covers_max_seconds,"
        " period_seconds_min, period_seconds_max, period_covered_seconds, period_weighted_sum)"
        f" SELECT {_bucket_time(postgresql, seconds)}, {keys}, sum(piece),"
        " sum(piece * coalesce(util_idle_fraction, 0)), max(util_max), max(mem_copy_util_max),"
        " max(fb_used_max_mib), max(covers_seconds), min(period_seconds), max(period_seconds),"
        " sum(CASE WHEN period_seconds IS NULL THEN 0 ELSE piece END),"
        " sum(coalesce(period_seconds * piece, 0))"
        f" FROM ({_pieces(postgresql, seconds)}) AS pieces GROUP BY b, {keys}"
    )


def _fill_pod_hour(postgresql: bool) -> None:
    seconds = 3600
    op.execute(
        f"{_steps(postgresql, seconds)}"
        "INSERT INTO pod_hour (hour, node, namespace, pod, owner_kind, owner_name, gpus,"
        " gpu_seconds, idle_gpu_seconds, util_max, mem_copy_util_max, fb_used_max_mib)"
        f" SELECT {_bucket_time(postgresql, seconds)}, node, namespace, pod, max(owner_kind),"
        " max(owner_name), max(gpus), sum(gpu_seconds), sum(idle_gpu_seconds), max(util_max),"
        " max(mem_copy_util_max), max(fb_used_max_mib) FROM ("
        " SELECT b, at, node, coalesce(namespace, '') AS namespace, pod,"
        " max(owner_kind) AS owner_kind, max(owner_name) AS owner_name, count(*) AS gpus,"
        " sum(piece) AS gpu_seconds,"
        " sum(piece * coalesce(util_idle_fraction, 0)) AS idle_gpu_seconds,"
        " max(util_max) AS util_max, max(mem_copy_util_max) AS mem_copy_util_max,"
        " max(fb_used_max_mib) AS fb_used_max_mib"
        f" FROM ({_pieces(postgresql, seconds, 'WHERE pod IS NOT NULL')}) AS pieces"
        " GROUP BY b, at, node, coalesce(namespace, ''), pod) AS cycles"
        " GROUP BY b, node, namespace, pod"
    )


# -- PostgreSQL partitions -------------------------------------------------------------------


def _days(first: datetime, last: datetime) -> list[datetime]:
    day = datetime(first.year, first.month, first.day, tzinfo=UTC)
    days = []
    while day <= last:
        days.append(day)
        day += timedelta(days=1)
    return days


def _months(first: datetime, last: datetime) -> list[datetime]:
    month = datetime(first.year, first.month, 1, tzinfo=UTC)
    months = []
    while month <= last:
        months.append(month)
        month = (month + timedelta(days=32)).replace(day=1)
    return months


def _attach(table: str, lower: datetime, upper: datetime, name: str, storage: str = "") -> None:
    bounds = f"FROM ('{lower:%Y-%m-%d %H:%M:%S}+00') TO ('{upper:%Y-%m-%d %H:%M:%S}+00')"
    op.execute(
        f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS){storage}"
    )
    op.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES {bounds}")


def _span(table: str, column: str) -> tuple[datetime, datetime] | None:
    first, last = (
        op.get_bind().exec_driver_sql(f"SELECT min({column}), max({column}) FROM {table}").one()
    )
    return None if first is None else (first.astimezone(UTC), last.astimezone(UTC))


def _partition_gpu_window() -> None:
    """gpu_window becomes partitioned by day: a new table, its rows copied in."""
    op.execute("ALTER TABLE gpu_window RENAME TO gpu_window_plain")
    op.execute(
        "ALTER TABLE gpu_window_plain RENAME CONSTRAINT pk_gpu_window TO pk_gpu_window_plain"
    )
    op.execute("ALTER INDEX ix_gpu_window_at RENAME TO ix_gpu_window_plain_at")
    op.execute("ALTER INDEX ix_gpu_window_node_gpu_at RENAME TO ix_gpu_window_plain_node_gpu_at")
    op.execute(
        "CREATE TABLE gpu_window (LIKE gpu_window_plain INCLUDING DEFAULTS) PARTITION BY RANGE (at)"
    )
    op.execute("ALTER TABLE gpu_window ADD CONSTRAINT pk_gpu_window PRIMARY KEY (id, at)")
    op.execute("CREATE INDEX ix_gpu_window_at ON gpu_window (at)")
    op.execute("CREATE INDEX ix_gpu_window_node_gpu_at ON gpu_window (node, gpu, at)")
    op.execute("ALTER SEQUENCE gpu_window_id_seq OWNED BY gpu_window.id")
    span = _span("gpu_window_plain", "at")
    # The days of the rows there are, and today's and tomorrow's: the daemons starting on the
    # new schema together find them there instead of queueing to create them.
    now = datetime.now(UTC)
    days = set(_days(now, now + timedelta(days=1)))
    if span is not None:
        days.update(_days(*span))
    for day in sorted(days):
        _attach("gpu_window", day, day + timedelta(days=1), f"gpu_window_p{day:%Y%m%d}")
    if span is not None:
        op.execute("INSERT INTO gpu_window SELECT * FROM gpu_window_plain")
    op.execute("DROP TABLE gpu_window_plain")


def _partition_rollups() -> None:
    """Monthly partitions for the rollups of the existing rows, this month and the next (the
    writer adds later ones)."""
    now = datetime.now(UTC)
    months = set(_months(now, (now.replace(day=1) + timedelta(days=32))))
    span = _span("gpu_window", "at")
    if span is not None:
        first, last = span
        months.update(_months(first - timedelta(seconds=_longest_covers()), last))
    for name in ("gpu_hour", "gpu_day", "pod_hour"):
        for month in sorted(months):
            upper = (month + timedelta(days=32)).replace(day=1)
            _attach(
                name,
                month,
                upper,
                f"{name}_p{month:%Y%m}",
                f" WITH (fillfactor = {ROLLUP_FILLFACTOR})",
            )


def _longest_covers() -> float:
    longest = op.get_bind().exec_driver_sql("SELECT max(covers_seconds) FROM gpu_window").scalar()
    return float(longest or 0.0)


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    _create_tables()
    if postgresql:
        _partition_gpu_window()
        _partition_rollups()
    for name, (bucket, seconds, key) in GPU_ROLLUPS.items():
        _fill_gpu_rollup(postgresql, name, bucket, seconds, key)
    _fill_pod_hour(postgresql)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE gpu_window RENAME TO gpu_window_partitioned")
        op.execute(
            "ALTER TABLE gpu_window_partitioned"
            " RENAME CONSTRAINT pk_gpu_window TO pk_gpu_window_partitioned"
        )
        op.execute("ALTER INDEX ix_gpu_window_at RENAME TO ix_gpu_window_partitioned_at")
        op.execute(
            "ALTER INDEX ix_gpu_window_node_gpu_at RENAME TO ix_gpu_window_partitioned_node_gpu_at"
        )
        op.execute("CREATE TABLE gpu_window (LIKE gpu_window_partitioned INCLUDING DEFAULTS)")
        op.execute("ALTER TABLE gpu_window ADD CONSTRAINT pk_gpu_window PRIMARY KEY (id)")
        op.execute("CREATE INDEX ix_gpu_window_at ON gpu_window (at)")
        op.execute("CREATE INDEX ix_gpu_window_node_gpu_at ON gpu_window (node, gpu, at)")
        op.execute("ALTER SEQUENCE gpu_window_id_seq OWNED BY gpu_window.id")
        op.execute("INSERT INTO gpu_window SELECT * FROM gpu_window_partitioned")
        op.execute("DROP TABLE gpu_window_partitioned")  # and its partitions
    op.drop_table("store_horizon")
    op.drop_table("pod_hour")
    op.drop_table("gpu_day")
    op.drop_table("gpu_hour")
