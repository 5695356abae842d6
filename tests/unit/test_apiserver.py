"""The stand-in API server (a test double) enforces what the real one would, checked with plain
HTTP (requests), independently of the kubernetes client the profiler uses."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.patches import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH
from tests.support.apiserver.server import StandInApiServer, running_apiserver, wait_until

NODE_PATH = "/api/v1/nodes/node-a"


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver(token="t0ken") as server:
        server.add_node("node-a", annotations={"keep": "me"})
        yield server


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.headers["Authorization"] = "Bearer t0ken"
        yield session


def patch(http: requests.Session, url: str, body: object, content_type: str) -> requests.Response:
    return http.patch(url, data=json.dumps(body), headers={"Content-Type": content_type}, timeout=5)


def test_requires_the_bearer_token(apiserver: StandInApiServer) -> None:
    answer = requests.get(apiserver.url + NODE_PATH, timeout=5)
    assert answer.status_code == 401
    assert answer.json()["kind"] == "Status"


def test_strategic_merge_patch_merges_and_deletes_with_null(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    body = {"metadata": {"annotations": {"a.io/x": "1", "keep": None}}}
    answer = patch(http, apiserver.url + NODE_PATH, body, STRATEGIC_MERGE_PATCH)

    assert answer.status_code == 200
    assert answer.json()["metadata"]["annotations"] == {"a.io/x": "1"}
    assert apiserver.node("node-a")["metadata"]["annotations"] == {"a.io/x": "1"}
    assert int(answer.json()["metadata"]["resourceVersion"]) > 1
    (recorded,) = apiserver.requests(method="PATCH")
    assert recorded.content_type == STRATEGIC_MERGE_PATCH
    assert recorded.json() == body


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ({"metadata": {}}, "application/x-yaml", 415),
        ({"metadata": {"annotations": {"a.io/x": "1"}}}, "application/apply-patch+yaml", 422),
        ([{"op": "add"}], STRATEGIC_MERGE_PATCH, 400),
        ({"op": "add"}, JSON_PATCH, 400),
        ([{"op": "move", "from": "/a", "path": "/b"}], JSON_PATCH, 400),
        ([{"op": "add", "path": "/metadata/labels/x", "value": "1"}], JSON_PATCH, 422),
        ([{"op": "remove", "path": "/metadata/annotations/nope"}], JSON_PATCH, 422),
        ([{"op": "test", "path": "/metadata/annotations/keep", "value": "you"}], JSON_PATCH, 422),
        ({"metadata": {"resourceVersion": "1"}}, STRATEGIC_MERGE_PATCH, 409),
        ({"metadata": {"uid": "someone-else"}}, MERGE_PATCH, 422),
        ({"metadata": {"name": "node-b"}}, STRATEGIC_MERGE_PATCH, 400),
        ({"metadata": {"annotations": {"a.io/x": 1}}}, STRATEGIC_MERGE_PATCH, 422),
        ({"metadata": {"annotations": {"bad key!": "1"}}}, STRATEGIC_MERGE_PATCH, 422),
        ({"metadata": {"annotations": {"a.io/big": "x" * 300_000}}}, STRATEGIC_MERGE_PATCH, 422),
    ],
)
def test_rejects_what_the_real_server_rejects(
    apiserver: StandInApiServer,
    http: requests.Session,
    body: object,
    content_type: str,
    status: int,
) -> None:
    answer = patch(http, apiserver.url + NODE_PATH, body, content_type)

    assert answer.status_code == status
    assert answer.json()["code"] == status
    assert apiserver.node("node-a")["metadata"]["annotations"] == {"keep": "me"}


POD_PATH = "/api/v1/namespaces/ml/pods/worker-0"
DND = "karpenter.sh~1do-not-disrupt"


def test_json_patch_tests_guard_the_operations_that_follow(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    """As the real server's patch library: a failed ``test`` is a 422 and changes nothing; a
    ``test`` of null passes on a missing member (its departure from RFC 6902)."""
    pod = apiserver.add_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    uid = pod["metadata"]["uid"]
    guarded = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": f"/metadata/annotations/{DND}", "value": None},
        {"op": "add", "path": f"/metadata/annotations/{DND}", "value": "true"},
    ]
    assert patch(http, apiserver.url + POD_PATH, guarded, JSON_PATCH).status_code == 200
    assert apiserver.pod("ml", "worker-0")["metadata"]["annotations"] == {
        "karpenter.sh/do-not-disrupt": "true"
    }

    again = patch(http, apiserver.url + POD_PATH, guarded, JSON_PATCH)  # no longer missing
    assert again.status_code == 422
    assert again.json()["reason"] == "Invalid"
    assert again.json()["message"] == (
        "the server rejected our request due to an error in our request"
    )
    assert "testing value" in again.json()["details"]["causes"][0]["message"]

    recreated = apiserver.recreate_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    removal = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "remove", "path": f"/metadata/annotations/{DND}"},
    ]
    assert patch(http, apiserver.url + POD_PATH, removal, JSON_PATCH).status_code == 422
    assert apiserver.pod("ml", "worker-0")["metadata"]["uid"] == recreated["metadata"]["uid"]


def test_a_stale_resource_version_in_a_patch_is_a_409_conflict(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    read = apiserver.add_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    version = read["metadata"]["resourceVersion"]
    apiserver.update_pod(
        "ml", "worker-0", lambda pod: pod["metadata"]["annotations"].update({"person": "was here"})
    )
    body = {"metadata": {"resourceVersion": version, "annotations": {"a.io/x": "1"}}}

    answer = patch(http, apiserver.url + POD_PATH, body, STRATEGIC_MERGE_PATCH)

    assert answer.status_code == 409
    assert answer.json()["reason"] == "Conflict"
    assert "the object has been modified" in answer.json()["message"]
    assert apiserver.pod("ml", "worker-0")["metadata"]["annotations"] == {"person": "was here"}
    current = apiserver.pod("ml", "worker-0")["metadata"]["resourceVersion"]
    body["metadata"]["resourceVersion"] = current
    assert patch(http, apiserver.url + POD_PATH, body, STRATEGIC_MERGE_PATCH).status_code == 200


def test_a_uid_precondition_fails_on_a_recreated_pod_of_the_same_name(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    first = apiserver.add_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    second = apiserver.recreate_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    body = {"metadata": {"uid": first["metadata"]["uid"], "annotations": {"a.io/x": "1"}}}

    answer = patch(http, apiserver.url + POD_PATH, body, STRATEGIC_MERGE_PATCH)

    assert answer.status_code == 422
    assert "metadata.uid" in answer.json()["message"]
    assert "field is immutable" in answer.json()["message"]
    assert apiserver.pod("ml", "worker-0")["metadata"]["annotations"] == {}
    body["metadata"]["uid"] = second["metadata"]["uid"]
    assert patch(http, apiserver.url + POD_PATH, body, STRATEGIC_MERGE_PATCH).status_code == 200


def test_recreating_a_pod_is_deleted_then_added_on_a_watch(apiserver: StandInApiServer) -> None:
    apiserver.add_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    since = apiserver.pod("ml", "worker-0")["metadata"]["resourceVersion"]
    apiserver.recreate_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    url = (
        f"{apiserver.url}/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&watch=true"
        f"&resourceVersion={since}&timeoutSeconds=1"
    )
    with requests.get(url, headers={"Authorization": "Bearer t0ken"}, timeout=5) as answer:
        events = [json.loads(line) for line in answer.iter_lines() if line]
    assert [event["type"] for event in events] == ["DELETED", "ADDED"]
    assert events[0]["object"]["metadata"]["uid"] != events[1]["object"]["metadata"]["uid"]


def test_not_json_body_is_bad_request(apiserver: StandInApiServer, http: requests.Session) -> None:
    answer = http.patch(
        apiserver.url + NODE_PATH,
        data=b"{not json",
        headers={"Content-Type": STRATEGIC_MERGE_PATCH},
        timeout=5,
    )
    assert answer.status_code == 400


def test_unknown_objects_answer_404_status(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    answer = http.get(apiserver.url + "/api/v1/namespaces/x/pods/nope", timeout=5)
    assert answer.status_code == 404
    assert answer.json() | {"message": ""} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "",
        "reason": "NotFound",
        "code": 404,
    }


def test_list_filters_by_node_and_carries_resource_version(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    apiserver.add_pod(pod_manifest("ml", "a", "node-a", gpus=1))
    apiserver.add_pod(pod_manifest("ml", "b", "node-b"))

    answer = http.get(
        apiserver.url + "/api/v1/pods", params={"fieldSelector": "spec.nodeName=node-a"}, timeout=5
    )

    listed = answer.json()
    assert [pod["metadata"]["name"] for pod in listed["items"]] == ["a"]
    assert listed["metadata"]["resourceVersion"].isdigit()


def watch_lines(
    apiserver: StandInApiServer, version: str, timeout_seconds: int, out: list[dict[str, object]]
) -> None:
    params = {
        "watch": "true",
        "fieldSelector": "spec.nodeName=node-a",
        "resourceVersion": version,
        "timeoutSeconds": str(timeout_seconds),
    }
    headers = {"Authorization": f"Bearer {apiserver.token}"}
    with requests.get(
        apiserver.url + "/api/v1/pods", params=params, headers=headers, stream=True, timeout=10
    ) as answer:
        assert answer.headers["Transfer-Encoding"] == "chunked"
        out.extend(json.loads(line) for line in answer.iter_lines() if line)


def test_watch_streams_events_for_the_node_then_ends_at_timeout(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    apiserver.add_pod(pod_manifest("ml", "before", "node-a"))
    version = http.get(apiserver.url + "/api/v1/pods", timeout=5).json()["metadata"][
        "resourceVersion"
    ]
    events: list[dict[str, object]] = []
    reader = threading.Thread(target=watch_lines, args=(apiserver, version, 1, events))
    started = time.monotonic()
    reader.start()
    assert wait_until(lambda: apiserver.open_watches == 1)

    apiserver.add_pod(pod_manifest("ml", "new", "node-a"))
    apiserver.add_pod(pod_manifest("ml", "other-node", "node-b"))
    apiserver.update_pod("ml", "new", lambda pod: pod["status"].update(phase="Succeeded"))
    apiserver.delete_pod("ml", "new")
    reader.join(5)

    assert 0.9 < time.monotonic() - started < 8  # ended by timeoutSeconds=1, not by the client
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [  # type: ignore[index]
        ("ADDED", "new"),
        ("MODIFIED", "new"),
        ("DELETED", "new"),
    ]


def test_watch_from_expired_version_gets_410(apiserver: StandInApiServer) -> None:
    apiserver.expire_history()
    events: list[dict[str, object]] = []

    watch_lines(apiserver, "1", 5, events)

    assert [e["type"] for e in events] == ["ERROR"]
    assert events[0]["object"]["code"] == 410  # type: ignore[index]


def test_break_watches_ends_open_watch_with_410(apiserver: StandInApiServer) -> None:
    events: list[dict[str, object]] = []
    reader = threading.Thread(target=watch_lines, args=(apiserver, "2", 30, events))
    reader.start()
    assert wait_until(lambda: apiserver.open_watches == 1)

    apiserver.break_watches_with_gone()
    reader.join(5)

    assert not reader.is_alive()
    assert events[-1]["type"] == "ERROR"
    assert events[-1]["object"]["code"] == 410  # type: ignore[index]


def test_injected_failures_then_recovery_and_retry_after(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    apiserver.fail("GET", NODE_PATH, 429, times=2, retry_after=3)

    answers = [http.get(apiserver.url + NODE_PATH, timeout=5) for _ in range(3)]

    assert [a.status_code for a in answers] == [429, 429, 200]
    assert answers[0].headers["Retry-After"] == "3"
    assert answers[0].json()["reason"] == "TooManyRequests"


def test_an_injected_500_is_the_real_servers_internal_error(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    """kubernetes/apimachinery@v0.35.7:pkg/api/errors/errors.go NewInternalError."""
    cause = 'failed calling webhook "guard.example.com": failed to call webhook: refused'
    apiserver.fail("PATCH", NODE_PATH, 500, times=1, cause=cause)

    answer = http.patch(
        apiserver.url + NODE_PATH,
        data="{}",
        headers={"Content-Type": "application/merge-patch+json"},
        timeout=5,
    )

    assert answer.status_code == 500
    assert answer.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"Internal error occurred: {cause}",
        "reason": "InternalError",
        "details": {"causes": [{"message": cause}]},
        "code": 500,
    }


def test_hang_outlasts_a_client_timeout(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    apiserver.hang("GET", NODE_PATH, seconds=2, times=1)

    with pytest.raises(requests.exceptions.ReadTimeout):
        http.get(apiserver.url + NODE_PATH, timeout=(1, 0.3))
    assert http.get(apiserver.url + NODE_PATH, timeout=5).status_code == 200


def test_kubeconfig_points_at_the_server_with_the_token(
    apiserver: StandInApiServer, tmp_path: Path
) -> None:
    document = yaml.safe_load(apiserver.write_kubeconfig(tmp_path / "config").read_text())

    assert document["clusters"][0]["cluster"]["server"] == apiserver.url
    assert document["users"][0]["user"]["token"] == "t0ken"


def test_server_side_apply_is_accepted_on_pods_with_a_field_manager(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    apiserver.add_pod(pod_manifest("ml", "worker-0", "node-a", gpus=1))
    applied = "metadata:\n  annotations:\n    karpenter.sh/do-not-disrupt: 'true'\n"
    headers = {"Content-Type": "application/apply-patch+yaml"}
    url = apiserver.url + POD_PATH
    answer = http.patch(url, data=applied, headers=headers, params={"fieldManager": "me"})
    assert answer.status_code == 200
    assert apiserver.pod("ml", "worker-0")["metadata"]["annotations"] == {
        "karpenter.sh/do-not-disrupt": "true"
    }
    refused = http.patch(url, data=applied, headers=headers)  # no fieldManager
    assert refused.status_code == 422
    assert "fieldManager: Required value" in refused.json()["message"]


def test_a_patch_that_changes_nothing_keeps_the_version_and_sends_no_event(
    apiserver: StandInApiServer, http: requests.Session
) -> None:
    pod = apiserver.add_pod(
        pod_manifest("ml", "worker-0", "node-a", gpus=1, annotations={"a.io/x": "1"})
    )
    before = pod["metadata"]["resourceVersion"]
    body = {"metadata": {"annotations": {"a.io/x": "1"}}}
    answer = patch(http, apiserver.url + POD_PATH, body, STRATEGIC_MERGE_PATCH)
    assert answer.status_code == 200
    assert answer.json()["metadata"]["resourceVersion"] == before
    assert apiserver.pod("ml", "worker-0")["metadata"]["resourceVersion"] == before
    changed = patch(
        http, apiserver.url + POD_PATH, {"metadata": {"annotations": {"a.io/x": "2"}}}, MERGE_PATCH
    )
    assert int(changed.json()["metadata"]["resourceVersion"]) > int(before)
