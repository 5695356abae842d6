"""Kubernetes client configuration shared by the pod watcher and the annotation sink.

In a pod (``KUBERNETES_SERVICE_HOST`` set) the service account is used; elsewhere a kubeconfig
file given with ``--kubeconfig`` / ``KUBECONFIG``. An explicit kubeconfig wins over the in-cluster
service account. With neither, Kubernetes integration is off (``connect`` returns None).

The official client loads the configuration and authenticates every request (its refresh hook
re-reads rotated service-account tokens and re-runs exec plugins). Requests go through its
``ApiClient`` with raw JSON in and out: the generated ``CoreV1Api`` module and the typed models
would add about 20 MiB to a daemon that needs three endpoints and a handful of fields.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
import yaml
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import load_incluster_config
from kubernetes.config.kube_config import load_kube_config
from kubernetes.watch.watch import iter_resp_lines

from profiler_app.core.errors import RetryLaterError, UserError, one_line

log = logging.getLogger(__name__)

# (connect, read) seconds: every call carries a timeout so a hung API server cannot stall a
# profiling cycle or shutdown.
DEFAULT_REQUEST_TIMEOUT: tuple[float, float] = (3.0, 10.0)

# The auth setting the client's Configuration fills from a token, kubeconfig user or exec plugin.
_AUTH_SETTINGS = ["BearerToken"]


# What one call can raise when the API server is unreachable, slow or refuses: the caller
# decides whether that is a miss (404), a retry (409) or a back-off (429, 5xx, timeouts).
class UnexpectedAnswerError(ValueError):
    """The API server (or something in front of it) answered with what is not a JSON object."""


TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
    UnexpectedAnswerError,
)


class KubernetesError(RetryLaterError):
    """Talking to the Kubernetes API failed: the daemon counts errors_total{kind="kubernetes"}
    and backs off, at least for the Retry-After the server sent."""


@dataclass(frozen=True)
class KubeConnection:
    """An API client plus the timeout every call made with it must carry."""

    api_client: ApiClient
    request_timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT

    def request(
        self,
        method: str,
        path: str,
        *,
        path_params: Mapping[str, str] | None = None,
        query: Mapping[str, str | int | bool | None] | None = None,
        body: object = None,
        content_type: str | None = None,
        timeout: tuple[float, float] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Send one authenticated request; the caller reads and releases the raw response.

        ``path`` may hold ``{name}`` placeholders filled, URL-quoted, from ``path_params``.
        Raises ApiException for a non-2xx answer, urllib3/OS errors for transport failures.
        """
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        serialized = self.api_client.param_serialize(
            method,
            path,
            path_params=dict(path_params or {}),
            query_params=[
                (key, value) for key, value in (query or {}).items() if value is not None
            ],
            header_params=headers,
            body=body,
            auth_settings=_AUTH_SETTINGS,
        )
        answer = self.api_client.call_api(
            *serialized, _request_timeout=timeout or self.request_timeout
        )
        if not 200 <= answer.status <= 299:
            answer.read()  # type: ignore[no-untyped-call]  # ends the exchange: conn back to the pool
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return raw_response(answer.response)

    def get_json(
        self,
        path: str,
        *,
        path_params: Mapping[str, str] | None = None,
        query: Mapping[str, str | int | bool | None] | None = None,
    ) -> dict[str, Any]:
        """GET ``path`` and decode its JSON object."""
        response = self.request("GET", path, path_params=path_params, query=query)
        try:
            document = json.loads(response.data)
        except ValueError:  # JSON or Unicode decoding
            document = None
        finally:
            response.release_conn()
        if not isinstance(document, dict):
            raise UnexpectedAnswerError(f"the API answer to GET {path} is not a JSON object")
        return document

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]


def connect(
    kubeconfig: str | None,
    *,
    request_timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT,
) -> KubeConnection | None:
    """The connection to use, or None when Kubernetes is not configured.

    Raises UserError (one line) for a kubeconfig that is missing or unusable.
    """
    configuration = Configuration()
    if kubeconfig:
        source = kubeconfig
        missing = [path for path in kubeconfig.split(os.pathsep) if not os.path.exists(path)]
        if missing:  # the client would say "Invalid kube-config file. No configuration found."
            raise UserError(f"cannot use kubeconfig {kubeconfig}: no such file {missing[0]}")
        try:
            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        except (ConfigException, OSError, yaml.YAMLError, ValueError, TypeError, KeyError) as error:
            raise UserError(f"cannot use kubeconfig {kubeconfig}: {one_line(error)}") from None
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        source = "in-cluster"
        try:
            load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except (ConfigException, OSError) as error:
            raise UserError(
                f"cannot use the in-cluster service account: {one_line(error)}"
            ) from None
    else:
        return None
    # Our callers back off themselves; urllib3's silent retries would multiply every timeout.
    configuration.retries = False
    log.info("Kubernetes API at %s (credentials from %s)", configuration.host, source)
    return KubeConnection(ApiClient(configuration), request_timeout)


def raw_response(value: object) -> urllib3.BaseHTTPResponse:
    """The HTTP response a ``_preload_content=False`` call returns (typed as the model)."""
    if not isinstance(value, urllib3.BaseHTTPResponse):
        raise TypeError(f"expected an HTTP response, got {type(value).__name__}")
    return value


def response_lines(response: urllib3.BaseHTTPResponse) -> Iterator[str]:
    """The lines of a streamed response (watch events), decoded, as they arrive."""
    lines: Iterator[str] = iter_resp_lines(response)  # type: ignore[no-untyped-call]
    return lines


def release(value: object) -> None:
    """Read what is left of a response we do not need and return its connection to the pool."""
    response = raw_response(value)
    response.drain_conn()
    response.release_conn()


def error_status(error: BaseException) -> int | None:
    """The HTTP status of an API error, None for transport failures (timeouts, refused)."""
    if isinstance(error, ApiException) and error.status:
        return int(error.status)
    return None


def retry_after_seconds(error: BaseException) -> float | None:
    """The Retry-After delay the API server asked for, if it did (seconds form only)."""
    headers: Any = getattr(error, "headers", None)
    if not headers:
        return None
    value = headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def describe(error: BaseException) -> str:
    """One log-safe line: status and reason, never headers or request bodies (tokens)."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason or ''}".strip()
    return one_line(error)
