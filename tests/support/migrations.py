"""Moving a store's schema to a revision with Alembic, as the migration tests do."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine

from profiler_app.sinks.store.engine import alembic_config


def migrate(engine: Engine, revision: str, *, down: bool = False) -> None:
    """Upgrades (or, with ``down``, downgrades) the store behind ``engine`` to ``revision``."""
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)
