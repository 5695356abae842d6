"""What the daemon's writer needs to know about the schema, without importing SQLAlchemy.

The tables themselves are defined once, in ``models.py`` (SQLAlchemy Core, for Alembic and
``report``); these are the constants both sides share.
"""

from datetime import UTC, datetime

# The newest revision in migrations/versions (a test checks it against Alembic's own answer).
SCHEMA_HEAD = "0018_packed_workload_indexes"
VERSION_TABLE = "alembic_version"
# PostgreSQL's unique keys treat NULLs as distinct, so an unknown pod start time would never
# conflict and every cycle would add a row; the epoch stands in for "unknown" instead.
UNKNOWN_START_TIME = datetime(1970, 1, 1, tzinfo=UTC)
# Reasons are stored joined by "; " and cut to this length (a handful of short reasons fit).
REASONS_LENGTH = 512
# Revision 0008: a pod's disk and network rates (bytes per second), by direction
# (profiler_app.core.model.IO_FIELDS) and statistic. pod_usage keeps both; pod_hour the peaks.
IO_DIRECTIONS = ("disk_read", "disk_write", "network_receive", "network_transmit")
IO_STATISTICS = ("max", "p95")


def io_column(direction: str, statistic: str) -> str:
    """The column of one direction's statistic, e.g. ``disk_read_bytes_per_second_max``."""
    return f"{direction}_bytes_per_second_{statistic}"


POD_IO_COLUMNS = tuple(io_column(d, s) for d in IO_DIRECTIONS for s in IO_STATISTICS)
POD_HOUR_IO_COLUMNS = tuple(io_column(d, "max") for d in IO_DIRECTIONS)
