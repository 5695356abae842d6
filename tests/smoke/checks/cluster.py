"""Talking to the cluster under test: the Kubernetes API, and in-cluster services through the API
server's service proxy (``/api/v1/namespaces/NS/services/NAME:PORT/proxy/...``), never through
port-forwards, so a run needs nothing but a kubeconfig.

Requests go through ``profiler_app.core.kube`` (the official Kubernetes client's configuration,
authentication, exec plugins such as ``aws eks get-token``, and time-outs). Answers are raw
JSON: the checks read a handful of fields of many kinds, and raw JSON keeps what a stand-in API
server must serve honest and small.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from profiler_app.core.errors import UserError
from profiler_app.core.kube import TRANSPORT_ERRORS, KubeConnection, connect

Json = dict[str, Any]
Query = Mapping[str, str | int | bool | None]
# (connect, read) seconds: the API server's proxy waits on Prometheus for heavy queries.
REQUEST_TIMEOUT = (10.0, 60.0)
LIST_PAGE_SIZE = 500


class SmokeError(Exception):
    """A request failed or answered nonsense; the message says which and what it said."""


class ApiError(SmokeError):
    """The API server refused a request with ``status``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ForbiddenError(ApiError):
    """The kubeconfig's user may not do what the suite needs: no amount of waiting helps."""


class CredentialsError(ForbiddenError):
    """The API server does not accept the kubeconfig's credentials (401): they expired (an AWS
    session's end stops ``aws eks get-token``) or are not this cluster's. Waiting does not help."""


class _CredentialPluginFailures(logging.Handler):
    """What the client's exec credential plugin (``aws eks get-token``) last said when it failed:
    the client logs it and sends the request with the credentials it had."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("exec:"):
            self.last = message


def unauthorized_message(method: str, path: str, plugin_failure: str | None) -> str:
    """A 401, told apart: expired credentials (what to renew), or credentials of another cluster."""
    said = f" (the credential plugin failed: {plugin_failure})" if plugin_failure else ""
    if plugin_failure and "expired" in plugin_failure.lower():
        return (
            f"{method} {path} answered 401 Unauthorized: the credentials expired{said}; renew "
            "them (AWS: a new session, e.g. `aws sts get-caller-identity` must work; in CI a role "
            "session at least as long as the job, role-duration-seconds), then run the suite again"
        )
    return (
        f"{method} {path} answered 401 Unauthorized: the API server does not accept the "
        f"kubeconfig's credentials{said}; they are expired or of another cluster (AWS: `aws eks "
        "update-kubeconfig`, or a fresh `pulumi stack output kubeconfig`)"
    )


def _status_message(body: bytes) -> str:
    """The ``message`` of a Status body, or the start of whatever else came back."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        document = json.loads(text)
    except ValueError:
        return text[:300] or "(empty body)"
    if isinstance(document, dict) and isinstance(document.get("message"), str):
        return str(document["message"])
    return text[:300]


@dataclass(frozen=True)
class ProxyAnswer:
    """What an in-cluster service answered through the API server's proxy."""

    status: int
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


class Cluster:
    """The cluster under test. Every method raises SmokeError with a readable message."""

    def __init__(self, connection: KubeConnection) -> None:
        self._connection = connection
        self._plugin_failures = _CredentialPluginFailures()
        logging.getLogger().addHandler(self._plugin_failures)

    @classmethod
    def from_kubeconfig(cls, path: str) -> Cluster:
        try:
            connection = connect(path, request_timeout=REQUEST_TIMEOUT)
        except UserError as error:
            raise SmokeError(str(error)) from None
        assert connection is not None  # a kubeconfig was given
        return cls(connection)

    def close(self) -> None:
        logging.getLogger().removeHandler(self._plugin_failures)
        self._connection.close()

    def _exchange(
        self,
        method: str,
        path: str,
        query: Query | None = None,
        body: object = None,
        content_type: str | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one request, whatever the status; SmokeError if none came back."""
        try:
            response = self._connection.request(
                method, path, query=query, body=body, content_type=content_type
            )
        except ApiException as error:
            return int(error.status or 0), (error.body or "").encode()
        except TRANSPORT_ERRORS as error:
            raise SmokeError(f"{method} {path} failed: {error}") from None
        try:
            return response.status, bytes(response.data)
        finally:
            response.release_conn()

    def _call(self, method: str, path: str, **kwargs: Any) -> bytes:
        status, data = self._exchange(method, path, **kwargs)
        if 200 <= status <= 299:
            return data
        if status == 401:
            failure = self._plugin_failures.last
            raise CredentialsError(unauthorized_message(method, path, failure), status)
        message = f"{method} {path} answered {status}: {_status_message(data)}"
        if status == 403:
            raise ForbiddenError(
                f"{message}: the credentials are valid, but their user may not do this (RBAC): "
                "use the cluster admin's kubeconfig, or grant what tests/smoke/README.md lists",
                status,
            )
        raise ApiError(message, status)

    def _json(self, method: str, path: str, **kwargs: Any) -> Json:
        data = self._call(method, path, **kwargs)
        try:
            document = json.loads(data)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise SmokeError(f"{method} {path} did not answer a JSON object: {data[:200]!r}")
        return document

    def get(self, path: str, query: Query | None = None) -> Json:
        return self._json("GET", path, query=query)

    def get_or_none(self, path: str) -> Json | None:
        """The object, or None when the API server says 404."""
        try:
            return self.get(path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list(self, path: str, query: Query | None = None) -> list[Json]:
        """Every item of a collection, following ``continue`` tokens page by page."""
        items: list[Json] = []
        token: str | None = None
        while True:
            page = self.get(path, {**(query or {}), "limit": LIST_PAGE_SIZE, "continue": token})
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    def create(self, path: str, body: Json) -> Json:
        return self._json("POST", path, body=body, content_type="application/json")

    def delete(self, path: str) -> None:
        """Delete, in the background; an object already gone is fine."""
        try:
            self._call("DELETE", path, query={"propagationPolicy": "Background"})
        except ApiError as error:
            if error.status != 404:
                raise

    def text(self, path: str, query: Query | None = None) -> str:
        return self._call("GET", path, query=query).decode("utf-8", errors="replace")

    def proxy(
        self,
        service: str,
        path: str,
        *,
        method: str = "GET",
        query: Query | None = None,
        body: Json | None = None,
    ) -> ProxyAnswer:
        """``method`` on ``path`` of ``service`` ("NAMESPACE/NAME:PORT") through the API server.

        Any answer from the service comes back as it is (a 401 from Grafana is an answer); only
        failing to reach the service raises.
        """
        namespace, _, name_port = service.partition("/")
        proxy_path = f"/api/v1/namespaces/{namespace}/services/{name_port}/proxy/{path}"
        content_type = "application/json" if body is not None else None
        status, data = self._exchange(
            method, proxy_path, query=query, body=body, content_type=content_type
        )
        if not 200 <= status <= 299 and _from_the_api_server(data):
            raise SmokeError(
                f"cannot reach service {service} through the API server's proxy: {status}: "
                f"{_status_message(data)}"
            )
        return ProxyAnswer(status, data)


def _from_the_api_server(body: bytes) -> bool:
    """A Status object: the API server itself refused (no endpoints, RBAC), not the service."""
    try:
        document = json.loads(body)
    except ValueError:
        return False
    return isinstance(document, dict) and document.get("kind") == "Status"


Probe = Callable[[], list[str]]
FIRST_POLL_SECONDS = 0.25
MAX_POLL_SECONDS = 2.0


def poll_delays(deadline: float) -> Iterator[float]:
    """Sleeps between polls until ``deadline`` (monotonic): short at first, then every 2 s."""
    delay = FIRST_POLL_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        yield min(delay, left)
        delay = min(delay * 2, MAX_POLL_SECONDS)


def eventually(probe: Probe, timeout: float) -> list[str]:
    """Run ``probe`` until it reports no problem or ``timeout`` seconds pass; return what it
    reported last (empty: all good). A SmokeError counts as a problem; ForbiddenError ends the
    wait at once, since waiting does not grant permissions."""
    delays = poll_delays(time.monotonic() + timeout)
    while True:
        try:
            problems = probe()
        except ForbiddenError as error:
            return [str(error)]
        except SmokeError as error:
            problems = [str(error)]
        delay = next(delays, None)
        if not problems or delay is None:
            return problems
        time.sleep(delay)


def fail_on(problems: list[str], headline: str) -> None:
    """Fail the check with ``headline`` and one line per problem, without a traceback: the
    message is the report (it is also what lands in the JUnit XML)."""
    if problems:
        pytest.fail(f"{headline}:\n" + "\n".join(f"- {problem}" for problem in problems), False)
