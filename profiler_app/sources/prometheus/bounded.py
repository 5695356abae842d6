"""Bounded Prometheus answers: a byte cap and a whole-request deadline.

requests' ``timeout`` bounds each socket read, not the request: a server sending one byte every
2 s is never timed out, and an answer of any size is read into memory. Here the body is read in
pieces (``read1``: one socket read each) up to ``max_bytes`` of decoded content, so a gzip bomb
is capped too, and a timer shuts the connection's socket down at the deadline, which ends a read
blocked on a slow server, in the status line, the headers or the body.

Parsing JSON costs about 8 times its size in Python objects (measured: 34 MiB of query_range
JSON grew the process by 269 MiB), so the default cap, 16 MiB, keeps a hostile answer well
under the DaemonSet's 512Mi limit; a node's real answers are a few MiB at most (11,000 points
per series, 56 MIG series).
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
import time
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, ReadTimeoutError

_PIECE_BYTES = 256 * 1024


class AnswerTooLargeError(Exception):
    """The answer passed the byte cap; it was not read further."""


class DeadlinePassedError(Exception):
    """The request did not finish within its deadline; its connection was shut down."""


class _Deadline:
    """Shuts down the sockets of one request once its deadline passes."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shutdown(sock)

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


_current: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar(
    "prometheus_deadline", default=None
)


class _Watched:
    """Hands the connection's socket to the running request's deadline before the answer is read
    (a reused keep-alive connection included)."""

    sock: socket.socket | None

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        deadline = _current.get()
        if deadline is not None and self.sock is not None:
            deadline.watch(self.sock)
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


class _WatchedConnection(_Watched, HTTPConnection):
    pass


class _WatchedTlsConnection(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection


class _TlsPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedTlsConnection


class WatchedAdapter(HTTPAdapter):
    """An adapter whose connections (direct or through a proxy) obey ``bounded_get``'s deadline."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _TlsPool}

    def proxy_manager_for(self, *args: Any, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(*args, **kwargs)
        manager.pool_classes_by_scheme = {"http": _Pool, "https": _TlsPool}
        return manager


def bounded_session() -> requests.Session:
    session = requests.Session()
    adapter = WatchedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def bounded_get(
    session: requests.Session,
    url: str,
    params: dict[str, str],
    *,
    read_timeout: float,
    deadline_seconds: float,
    max_bytes: int,
) -> tuple[requests.Response, bytearray]:
    """The response and its decoded body, read within ``deadline_seconds`` and ``max_bytes``.

    Raises ``DeadlinePassedError``, ``AnswerTooLargeError``, or what requests raises (timeouts
    of one read, refused connections).
    """
    deadline = _Deadline(deadline_seconds)
    token = _current.set(deadline)
    started = time.monotonic()
    response: requests.Response | None = None
    try:
        response = session.get(
            url, params=params, timeout=min(read_timeout, deadline_seconds), stream=True
        )
        return response, _body(response, max_bytes, deadline)
    except (requests.RequestException, OSError) as error:
        if deadline.expired or time.monotonic() - started >= deadline_seconds:
            raise DeadlinePassedError from error
        raise
    finally:
        _current.reset(token)
        deadline.cancel()
        if response is not None:
            response.close()


def _body(response: requests.Response, max_bytes: int, deadline: _Deadline) -> bytearray:
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes and not _encoded(response):
        raise AnswerTooLargeError
    pieces = bytearray()
    raw = response.raw
    while True:
        try:
            piece = raw.read1(_PIECE_BYTES, decode_content=True)
        except ReadTimeoutError as error:  # urllib3's, as requests maps them for its own reads
            raise requests.ReadTimeout(str(error)) from error
        except HTTPError as error:
            raise requests.ConnectionError(str(error)) from error
        if not piece:
            break
        pieces += piece
        if len(pieces) > max_bytes:
            raise AnswerTooLargeError
    if deadline.expired:  # a shut-down socket can end the read like an end of file
        raise DeadlinePassedError
    return pieces


def _encoded(response: requests.Response) -> bool:
    return response.headers.get("Content-Encoding", "identity") != "identity"
