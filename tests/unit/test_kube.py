"""Kubernetes client configuration: kubeconfig, in-cluster service account, or disabled.

Requests go to the stand-in API server (a test double, tests/support/apiserver/). The
in-cluster case points the client library's service-account file paths at temp files, since
/var/run/secrets does not exist here.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config

from profiler_app.core.errors import UserError
from profiler_app.core.kube import connect, describe, error_status, retry_after_seconds
from tests.support.apiserver.server import running_apiserver


def test_disabled_without_kubeconfig_or_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert connect(None) is None
    assert connect("") is None


def test_kubeconfig_sends_token_and_never_logs_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with running_apiserver() as apiserver:
        apiserver.add_node("node-a")
        connection = connect(str(apiserver.write_kubeconfig(tmp_path / "config")))
        assert connection is not None
        try:
            node = connection.get_json("/api/v1/nodes/{name}", path_params={"name": "node-a"})
        finally:
            connection.close()
        assert node["metadata"]["name"] == "node-a"
        (request,) = apiserver.requests()
        assert request.authorization == f"Bearer {apiserver.token}"
        assert "Kubernetes API at http://127.0.0.1" in caplog.text
        assert apiserver.token not in caplog.text


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("clusters: [unclosed", "cannot use kubeconfig"),
        ("apiVersion: v1\nkind: Config\nclusters: []\n", "current-context|context"),
    ],
)
def test_bad_kubeconfig_is_one_user_error_line(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)

    with pytest.raises(UserError, match=problem) as raised:
        connect(str(path))

    message = str(raised.value)
    assert message.startswith(f"cannot use kubeconfig {path}")
    assert "\n" not in message


def test_in_cluster_without_service_account_files_is_a_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "missing"))

    with pytest.raises(UserError, match="in-cluster service account"):
        connect(None)


def service_account(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    token = "in-cluster-dummy-token"
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_text("not used before a request\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return token


def test_in_cluster_uses_the_service_account(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = service_account(monkeypatch, tmp_path)

    with caplog.at_level(logging.INFO, logger="profiler_app.core.kube"):
        connection = connect(None)

    assert connection is not None
    configuration = connection.api_client.configuration
    assert configuration.host == "https://10.96.0.1:443"
    assert token in configuration.get_api_key_with_prefix("BearerToken")
    assert "credentials from in-cluster" in caplog.text
    assert token not in caplog.text
    connection.close()


def test_explicit_kubeconfig_wins_over_in_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    service_account(monkeypatch, tmp_path)
    with running_apiserver() as apiserver:
        connection = connect(str(apiserver.write_kubeconfig(tmp_path / "config")))
        assert connection is not None
        assert connection.api_client.configuration.host == apiserver.url
        connection.close()


def test_error_helpers_read_status_retry_after_and_stay_one_line() -> None:
    error = ApiException(status=429, reason="Too Many Requests")
    error.headers = {"Retry-After": "7"}

    assert error_status(error) == 429
    assert retry_after_seconds(error) == 7.0
    assert describe(error) == "HTTP 429 Too Many Requests"
    assert error_status(TimeoutError("read timed out")) is None
    assert retry_after_seconds(TimeoutError()) is None
    assert describe(OSError("connection\nrefused")) == "OSError: connection refused"


def test_expiring_exec_credentials_are_refreshed_before_each_request(tmp_path: Path) -> None:
    """An exec plugin (as EKS' aws-iam-authenticator uses) whose token has already expired runs
    again before every request: the raw-JSON requests keep the client's refresh hook working."""
    plugin = tmp_path / "credential-plugin.py"
    runs = tmp_path / "runs"
    plugin.write_text(
        "import json, pathlib, sys\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "runs.write_text(str(int(runs.read_text() if runs.exists() else '0') + 1))\n"
        "json.dump({'apiVersion': 'client.authentication.k8s.io/v1beta1',\n"
        "    'kind': 'ExecCredential', 'status': {'token': sys.argv[1],\n"
        "    'expirationTimestamp': '2000-01-01T00:00:00Z'}}, sys.stdout)\n"
    )
    with running_apiserver() as apiserver:
        apiserver.add_node("node-a")
        kubeconfig = tmp_path / "config"
        exec_user = {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin), apiserver.token],
        }
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": apiserver.url}}],
                    "users": [{"name": "u", "user": {"exec": exec_user}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        connection = connect(str(kubeconfig))
        assert connection is not None
        try:
            runs_after_connect = int(runs.read_text())
            for _ in range(2):
                connection.get_json("/api/v1/nodes/{name}", path_params={"name": "node-a"})
        finally:
            connection.close()
        assert int(runs.read_text()) == runs_after_connect + 2
        assert [r.authorization for r in apiserver.requests()] == [f"Bearer {apiserver.token}"] * 2


def test_non_2xx_answers_raise_api_exception_with_status(tmp_path: Path) -> None:
    with running_apiserver() as apiserver:
        connection = connect(str(apiserver.write_kubeconfig(tmp_path / "config")))
        assert connection is not None
        try:
            with pytest.raises(ApiException) as raised:
                connection.get_json("/api/v1/nodes/{name}", path_params={"name": "absent"})
        finally:
            connection.close()
        assert error_status(raised.value) == 404
