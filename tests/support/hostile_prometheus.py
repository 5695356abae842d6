"""A hostile Prometheus on 127.0.0.1: a huge answer, a byte drip, 429 or 503 with Retry-After.

Test double for the HTTP side of Prometheus' API where the real server cannot misbehave on
demand. The answer's shape is Prometheus' own ``query_range`` document (prometheus/prometheus
@v3.5.0:web/api/v1/api.go, ``response`` with ``status`` and ``data.resultType``/``result``);
Retry-After is RFC 9110 section 10.2.3 (seconds), as proxies and query frontends in front of
Prometheus send it with 429 and 503.

Bounded and self-stopping: every answer ends after ``limit_seconds`` even if the client keeps
reading, a client that hangs up ends it at once, and leaving the context shuts the server down.
Responses are written on the raw socket so that even the status line can drip.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

MATRIX_HEAD = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":'
MATRIX_HEAD += b'{"Hostname":"gpu-node-1","gpu":"0","UUID":"GPU-0"},"values":['
MATRIX_TAIL = b"]}]}}"


def matrix_body(total_bytes: int, piece_bytes: int = 1 << 20) -> Iterator[bytes]:
    """A valid query_range document of about ``total_bytes``, made piece by piece (a server
    does not hold it in memory)."""
    yield MATRIX_HEAD
    sent, timestamp = len(MATRIX_HEAD), 1_700_000_000
    while sent < total_bytes:
        pairs = []
        size = 0
        while size < piece_bytes and sent + size < total_bytes:
            pair = f'[{timestamp}.000,"{timestamp % 100}.5"],'.encode()
            pairs.append(pair)
            size += len(pair)
            timestamp += 10
        sent += size
        yield b"".join(pairs)
    yield f'[{timestamp}.000,"0"]'.encode() + MATRIX_TAIL


@dataclass
class Behaviour:
    """What the server does with every request."""

    kind: str  # "huge", "drip-body", "drip-status", "retry-after"
    total_bytes: int = 256 * 2**20  # huge
    drip_period: float = 2.0  # drip: seconds between bytes
    status: int = 429  # retry-after
    retry_after: str = "7"


class HostilePrometheus:
    """``with HostilePrometheus(Behaviour("huge")) as server: ... server.url``."""

    def __init__(self, behaviour: Behaviour, limit_seconds: float = 30.0) -> None:
        self.behaviour = behaviour
        self.limit_seconds = limit_seconds
        self.requests = 0
        self.bytes_sent = 0
        hostile = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                connection: socket.socket = self.request
                connection.settimeout(limit_seconds)
                with self_stopping():
                    _read_request(connection)
                    hostile.requests += 1
                    hostile._answer(connection)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> HostilePrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, connection: socket.socket) -> None:
        behaviour, ends = self.behaviour, time.monotonic() + self.limit_seconds
        if behaviour.kind == "huge":  # no Content-Length: the client cannot refuse it up front
            self._send(connection, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            self._send(connection, b"Connection: close\r\n\r\n")
            for piece in matrix_body(behaviour.total_bytes):
                if time.monotonic() > ends:
                    return
                self._send(connection, piece)
        elif behaviour.kind == "retry-after":
            body = b'{"status":"error","errorType":"unavailable","error":"too many queries"}'
            head = (
                f"HTTP/1.1 {behaviour.status} Busy\r\nContent-Type: application/json\r\n"
                f"Retry-After: {behaviour.retry_after}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            self._send(connection, head.encode() + body)
        else:
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            head += b"Content-Length: 100000\r\n\r\n"
            if behaviour.kind == "drip-body":
                self._send(connection, head)
                head = b"{" + b" " * 99_999
            for byte in head:
                if time.monotonic() > ends:
                    return
                self._send(connection, bytes([byte]))
                time.sleep(behaviour.drip_period)

    def _send(self, connection: socket.socket, data: bytes) -> None:
        connection.sendall(data)
        self.bytes_sent += len(data)


class self_stopping:  # noqa: N801 (a context manager used like a function)
    """Ends a handler quietly when the client hangs up or stops reading."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> bool:
        return kind is not None and issubclass(kind, OSError)


def _read_request(connection: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = connection.recv(4096)
        if not piece:
            break
        data += piece
    return data
