"""Kubernetes client configuration shared by the pod watcher and the annotation sink.

In a pod (``KUBERNETES_SERVICE_HOST`` set) the service account is used; elsewhere a kubeconfig
file given with ``--kubeconfig`` / ``KUBECONFIG``. An explicit kubeconfig wins over the in-cluster
service account. With neither, Kubernetes integration is off (``connect`` returns None).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from profiler_app.errors import UserError

log = logging.getLogger(__name__)

# (connect, read) seconds: every call carries a timeout so a hung API server cannot stall a
# profiling cycle or shutdown.
DEFAULT_REQUEST_TIMEOUT: tuple[float, float] = (3.0, 10.0)

# What one call can raise when the API server is unreachable, slow or refuses: the caller
# decides whether that is a miss (404), a retry (409) or a back-off (429, 5xx, timeouts).
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    ApiException,
    urllib3.exceptions.HTTPError,
    OSError,
)


class KubernetesError(Exception):
    """Talking to the Kubernetes API failed: the daemon counts errors_total{kind="kubernetes"}."""


@dataclass(frozen=True)
class KubeConnection:
    """An API client plus the timeout every call made with it must carry."""

    api_client: client.ApiClient
    request_timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT
    source: str = ""  # "in-cluster" or the kubeconfig path, for the startup log line

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]


def connect(
    kubeconfig: str | None,
    *,
    request_timeout: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT,
    environ: dict[str, str] | None = None,
) -> KubeConnection | None:
    """The connection to use, or None when Kubernetes is not configured.

    Raises UserError (one line) for a kubeconfig that is missing or unusable.
    """
    env = os.environ if environ is None else environ
    configuration = client.Configuration()
    if kubeconfig:
        source = kubeconfig
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        except (ConfigException, OSError, yaml.YAMLError, ValueError, TypeError, KeyError) as error:
            raise UserError(f"cannot use kubeconfig {kubeconfig}: {_one_line(error)}") from None
    elif env.get("KUBERNETES_SERVICE_HOST"):
        source = "in-cluster"
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except (ConfigException, OSError) as error:
            raise UserError(
                f"cannot use the in-cluster service account: {_one_line(error)}"
            ) from None
    else:
        return None
    # Our callers back off themselves; urllib3's silent retries would multiply every timeout.
    configuration.retries = False
    log.info("Kubernetes API at %s (credentials from %s)", configuration.host, source)
    return KubeConnection(client.ApiClient(configuration), request_timeout, source)


def raw_response(value: object) -> urllib3.BaseHTTPResponse:
    """The HTTP response a ``_preload_content=False`` call returns (typed as the model)."""
    if not isinstance(value, urllib3.BaseHTTPResponse):
        raise TypeError(f"expected an HTTP response, got {type(value).__name__}")
    return value


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
    return f"{type(error).__name__}: {_one_line(error)}"


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__
