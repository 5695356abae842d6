"""KubernetesSink when the API server fails it: a deleted pod or a missing node said once, a
conflict retried, a 429's Retry-After handed to the daemon, server errors and a hung server
raised and recovered from, an answer that is not JSON, and the token never logged.

Against the stand-in API server (a test double, tests/support/apiserver/), over real HTTP,
through the real client; its node and pod: tests/support/annotated_node.py. Request timeouts
are real but short.
"""

from __future__ import annotations

import dataclasses
import http.server
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profiler_app.core.kube import KubernetesError, connect
from profiler_app.sinks.kubernetes import KubernetesSink
from tests.support.annotated_node import NODE, NODE_PATH, POD_PATH, D, node_with_trainer, on_node
from tests.support.apiserver.server import StandInApiServer, running_apiserver
from tests.support.clock import FakeClock
from tests.support.cycles import sample_cycle


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with node_with_trainer() as server:
        yield server


def test_deleted_pod_is_logged_once_and_not_retried(
    apiserver: StandInApiServer, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.delete_pod("ml", "trainer-0")
    caplog.set_level(logging.INFO, logger="profiler_app")

    result = sample_cycle(NODE)
    sink.publish(result)
    sink.publish(
        dataclasses.replace(result, pods=[dataclasses.replace(result.pods[0], cpu_util_max=1)])
    )

    assert len(apiserver.requests(method="PATCH", path=POD_PATH)) == 1
    assert caplog.text.count("trainer-0 is gone") == 1
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_missing_node_raises_and_is_logged_once(
    apiserver: StandInApiServer, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.remove_node(NODE)
    caplog.set_level(logging.WARNING, logger="profiler_app")

    for _ in range(2):
        with pytest.raises(KubernetesError, match=f"node {NODE} not found"):
            sink.publish(sample_cycle(NODE))

    assert caplog.text.count("check --node") == 1
    apiserver.add_node(NODE)
    sink.publish(sample_cycle(NODE))
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_conflict_is_retried(apiserver: StandInApiServer, sink: KubernetesSink) -> None:
    apiserver.fail("PATCH", NODE_PATH, 409, times=2)

    sink.publish(sample_cycle(NODE))

    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 3
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_persistent_conflict_raises_after_retries(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.fail("PATCH", NODE_PATH, 409)

    with pytest.raises(KubernetesError, match="409"):
        sink.publish(sample_cycle(NODE))

    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 3


def test_too_many_requests_carries_retry_after_to_the_daemon(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    """The sink has no back-off of its own: it says what failed and what the server asked for;
    the daemon waits (profiler_app.core.backoff)."""
    apiserver.fail("PATCH", NODE_PATH, 429, times=1, retry_after=45)
    result = sample_cycle(NODE)

    with pytest.raises(KubernetesError, match=r"HTTP 429.*Retry-After 45s") as raised:
        sink.publish(result)
    assert raised.value.retry_after == 45

    sink.publish(result)  # called again, it tries again
    assert [r.method for r in apiserver.requests()][-2:] == ["PATCH", "PATCH"]  # node, then pod
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_server_errors_raise_without_retry_after_and_the_next_call_recovers(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.fail("PATCH", NODE_PATH, 500, times=1)
    result = sample_cycle(NODE)

    with pytest.raises(KubernetesError, match=r"HTTP 500") as raised:
        sink.publish(result)
    assert raised.value.retry_after is None
    sink.publish(result)
    assert len(apiserver.requests(method="PATCH", path=NODE_PATH)) == 2
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"
    apiserver.fail("PATCH", POD_PATH, 503, times=1)
    with pytest.raises(KubernetesError, match=r"HTTP 503"):
        sink.publish(
            dataclasses.replace(result, pods=[dataclasses.replace(result.pods[0], cpu_util_max=1)])
        )


def test_hung_server_times_out_and_recovers(
    apiserver: StandInApiServer, sink: KubernetesSink
) -> None:
    apiserver.hang("PATCH", NODE_PATH, seconds=8, times=1)
    result = sample_cycle(NODE)

    started = time.monotonic()
    with pytest.raises(KubernetesError, match=r"ReadTimeoutError|timed out"):
        sink.publish(result)
    assert time.monotonic() - started < 5  # the 0.5 s read timeout, not the 8 s hang

    sink.publish(result)
    assert on_node(apiserver)[f"{D}/gpu-0-job-type"] == "training"


def test_token_is_sent_but_never_logged(
    apiserver: StandInApiServer, sink: KubernetesSink, caplog: pytest.LogCaptureFixture
) -> None:
    # Each logger explicitly: the CLI quiets the clients' loggers for the rest of the process.
    for name in (None, "kubernetes", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=name)
    apiserver.fail("PATCH", NODE_PATH, 500, times=1)

    with pytest.raises(KubernetesError) as raised:
        sink.publish(sample_cycle(NODE))

    assert all(r.authorization == f"Bearer {apiserver.token}" for r in apiserver.requests())
    assert caplog.records  # debug logging really was captured
    assert apiserver.token not in caplog.text
    assert apiserver.token not in str(raised.value)


class _HtmlHandler(http.server.BaseHTTPRequestHandler):
    """What a misconfigured proxy in front of the API server might answer: 200 with HTML."""

    def do_GET(self) -> None:
        body = b"<html>login</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def test_non_json_answer_is_a_kubernetes_error(tmp_path: Path, clock: FakeClock) -> None:
    """A stand-in HTTP server (test double) answering HTML instead of a Node object."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HtmlHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with running_apiserver() as apiserver:
            kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        kubeconfig.write_text(kubeconfig.read_text().replace(apiserver.url, url))
        made = connect(str(kubeconfig), request_timeout=(1.0, 1.0))
        assert made is not None
        sink = KubernetesSink(made, NODE, clock=clock)
        with pytest.raises(KubernetesError, match="not a JSON object"):
            sink.publish(sample_cycle(NODE))
        made.close()
    finally:
        server.shutdown()
        server.server_close()
