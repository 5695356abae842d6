"""The table store: per-GPU window summaries and per-pod peaks in SQLite or PostgreSQL.

``TableStore`` and ``StoreError`` load the store's modules on first use: ``urls`` alone (the
``--store-url`` option's default, in every command's ``--help``) leaves them unloaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profiler_app.core.lazy import lazy_names
from profiler_app.sinks.store.urls import default_store_url

if TYPE_CHECKING:
    from profiler_app.sinks.store.sink import StoreError, TableStore

__all__ = ["StoreError", "TableStore", "default_store_url"]

if not TYPE_CHECKING:  # hidden from mypy, which checks each name against the imports above
    __getattr__ = lazy_names(__name__, {"StoreError": "sink", "TableStore": "sink"})
