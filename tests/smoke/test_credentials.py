"""The smoke suite tells expired credentials from forbidden ones.

An EKS kubeconfig gets its token from ``aws eks get-token`` (an exec credential plugin) for every
15 minutes; once the AWS session behind it ends, the plugin fails, the client keeps sending its
last token, and the API server answers 401 when that expires. That is not a permissions problem,
and must not read as one. Test doubles: the stand-in API server (tests/support/apiserver/) and
a stand-in credential plugin that fails as the AWS CLI does with an expired session.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.smoke.checks.cluster import Cluster, CredentialsError, ForbiddenError, eventually
from tests.support.apiserver.server import StandInApiServer, running_apiserver

PLUGIN = """
import datetime, json, pathlib, sys
calls = pathlib.Path(sys.argv[1])
count = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(count + 1))
if count >= 1:  # the session ended after the first token
    print("An error occurred (ExpiredToken) when calling the AssumeRole operation: The security "
          "token included in the request is expired", file=sys.stderr)
    sys.exit(255)
soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": {"token": sys.argv[2], "expirationTimestamp": soon.strftime("%Y-%m-%dT%H:%M:%SZ")},
}))
"""


def exec_kubeconfig(folder: Path, server: StandInApiServer) -> Path:
    """A kubeconfig whose user gets its token from the stand-in plugin, as EKS' do."""
    plugin = folder / "get-token.py"
    plugin.write_text(PLUGIN)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin), str(folder / "calls"), server.token],
            "interactiveMode": "Never",
        }
    }
    config = yaml.safe_load(server.write_kubeconfig(folder / "base").read_text())
    config["users"][0]["user"] = user
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


NODE = "/api/v1/nodes/gpu-node-1"


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_node("gpu-node-1")
        yield server


def test_an_expired_session_reads_as_expired_credentials(
    tmp_path: Path, apiserver: StandInApiServer
) -> None:
    cluster = Cluster.from_kubeconfig(str(exec_kubeconfig(tmp_path, apiserver)))
    try:
        assert cluster.get(NODE)["metadata"]["name"] == "gpu-node-1"
        time.sleep(1.5)  # the token is past its expiry: the client runs the plugin again
        apiserver._state.token = "rotated"  # and the API server no longer takes the old token
        with pytest.raises(CredentialsError) as raised:
            cluster.get(NODE)
        message = str(raised.value)
        assert "answered 401 Unauthorized: the credentials expired" in message
        assert "ExpiredToken" in message
        assert "role-duration-seconds" in message
        assert "RBAC" not in message
        started = time.monotonic()
        assert eventually(lambda: [str(cluster.get(NODE))], 30) == [message]
        assert time.monotonic() - started < 5  # no waiting: renewing takes a person
    finally:
        cluster.close()


def test_credentials_of_another_cluster_are_not_called_expired(
    tmp_path: Path, apiserver: StandInApiServer
) -> None:
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"]["token"] = "another-clusters-token"
    path.write_text(yaml.safe_dump(config))
    cluster = Cluster.from_kubeconfig(str(path))
    try:
        with pytest.raises(CredentialsError) as raised:
            cluster.get(NODE)
        message = str(raised.value)
        assert "the API server does not accept the kubeconfig's credentials" in message
        assert "expired or of another cluster" in message
        assert "the credentials expired" not in message
    finally:
        cluster.close()


def test_forbidden_is_a_permissions_problem(tmp_path: Path, apiserver: StandInApiServer) -> None:
    apiserver.fail("GET", NODE, 403)
    cluster = Cluster.from_kubeconfig(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        with pytest.raises(ForbiddenError) as raised:
            cluster.get(NODE)
        assert not isinstance(raised.value, CredentialsError)
        assert "answered 403" in str(raised.value)
        assert "may not do this (RBAC)" in str(raised.value)
    finally:
        cluster.close()
