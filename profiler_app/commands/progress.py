"""A spinner for work that may take a while, shown on a terminal only.

It appears once the work has taken ``delay`` seconds (a quick query shows nothing), on stderr
and only when stderr is a terminal: a pipe or a log file never receives it, and stdout, which
holds the result, is never touched.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

DEFAULT_DELAY_SECONDS = 1.0


@contextmanager
def spinner(
    message: str, *, delay: float = DEFAULT_DELAY_SECONDS, stream: TextIO | None = None
) -> Iterator[None]:
    """Shows ``message`` with a spinner while the block runs longer than ``delay`` seconds."""
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        yield
        return
    from rich.console import Console  # noqa: PLC0415  (only on a terminal)

    status = Console(file=stream, stderr=True).status(message)
    lock = threading.Lock()
    finished = False

    def show() -> None:
        with lock:
            if not finished:
                status.start()

    timer = threading.Timer(delay, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            finished = True
            status.stop()
