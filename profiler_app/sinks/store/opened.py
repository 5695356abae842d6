"""A store opened by a one-shot command (``trace``, ``trial``): migrated to head on opening, each
database error turned into one line naming the store."""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

from profiler_app.core.errors import UserError
from profiler_app.sinks.store.dbapi import UnknownSchemaError
from profiler_app.sinks.store.engine import create_store_engine, describe_error, upgrade_to_head
from profiler_app.sinks.store.urls import parse_store_url


class OpenedStore:
    def __init__(self, url: str, *, create: bool = True) -> None:
        parsed = parse_store_url(url)
        self.url = parsed.display()
        self._engine = create_store_engine(parsed, create_file=create)
        try:
            upgrade_to_head(self._engine)
        except UnknownSchemaError as error:
            raise UserError(
                f"store {self.url} has a schema this gpu-profiler does not know ({error})"
            ) from None
        except SQLAlchemyError as error:
            raise self._error(error) from None

    def close(self) -> None:
        self._engine.dispose()

    def _error(self, error: SQLAlchemyError) -> UserError:
        return UserError(f"store {self.url}: {describe_error(error)}")
