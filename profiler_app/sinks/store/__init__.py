"""The table store: per-GPU window summaries and per-pod peaks in SQLite or PostgreSQL."""

from profiler_app.sinks.store.sink import StoreError, TableStore
from profiler_app.sinks.store.urls import default_store_url

__all__ = ["StoreError", "TableStore", "default_store_url"]
