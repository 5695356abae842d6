"""``report``'s views and defaults, without the store layer: ``report --help`` and its argument
checks import this, not SQLAlchemy (``reporting.py`` builds the views)."""

from __future__ import annotations

REPORT_VIEWS = ("node", "gpu", "pod", "idle-pods", "waste", "trace", "trial")
DEFAULT_IDLE_BELOW_PERCENT = 5.0
