"""What the daemon's writer needs to know about the schema, without importing SQLAlchemy.

The tables themselves are defined once, in ``models.py`` (SQLAlchemy Core, for Alembic and
``report``); these are the constants both sides share.
"""

from datetime import UTC, datetime

# The newest revision in migrations/versions (a test checks it against Alembic's own answer).
SCHEMA_HEAD = "0009_gpu_identity"
VERSION_TABLE = "alembic_version"
# PostgreSQL's unique keys treat NULLs as distinct, so an unknown pod start time would never
# conflict and every cycle would add a row; the epoch stands in for "unknown" instead.
UNKNOWN_START_TIME = datetime(1970, 1, 1, tzinfo=UTC)
# Reasons are stored joined by "; " and cut to this length (a handful of short reasons fit).
REASONS_LENGTH = 512
