"""Alembic environment of the store.

The store calls migrations with an open connection (``config.attributes["connection"]``). The
``alembic`` command line works too, with an ini file whose ``script_location`` is this directory
and the URL in ``-x url=...`` or ``sqlalchemy.url`` (offline ``--sql`` output for DBAs included).
"""

from alembic import context
from sqlalchemy import create_engine

from profiler_app.sinks.store.models import metadata
from profiler_app.sinks.store.partitions import is_partition

config = context.config
target_metadata = metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("give the store URL: alembic -x url=postgresql+psycopg://... upgrade head")
    return url


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate compares the models' tables, not the partitions the writer makes."""
    return not (type_ == "table" and name is not None and is_partition(name))


def run_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True, include_name=include_name
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, include_name=include_name
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    with engine.begin() as own_connection:
        context.configure(
            connection=own_connection, target_metadata=target_metadata, include_name=include_name
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
