"""The table store: per-GPU window summaries and per-pod peaks in SQLite or PostgreSQL."""

from profiler_app.sinks.store.engine import default_store_url
from profiler_app.sinks.store.sink import StoreError, TableStore

__all__ = ["StoreError", "TableStore", "default_store_url"]
