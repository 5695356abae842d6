"""PodWatcher against the stand-in API server, over real HTTP, through the real client.

The API server is a test double (tests/support/apiserver/): no kube-apiserver can run here.
Timeouts and back-off delays are shortened so each test takes well under a second or two.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from profiler_app.core.kube import KubeConnection
from profiler_app.sources.kube_pods import ListPagingError, PodInfo, PodWatcher, pod_info
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver, wait_until

NODE = "node-a"
PODS_PATH = "/api/v1/pods"
STARTED = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        server.add_pod(pod_manifest("ml", "trainer-0", NODE, gpus=2, start_time=STARTED))
        server.add_pod(pod_manifest("web", "frontend", NODE))
        server.add_pod(pod_manifest("ml", "elsewhere", "node-b", gpus=1))
        yield server


@pytest.fixture
def make_watcher(connection: KubeConnection) -> Iterator[Any]:
    watchers: list[PodWatcher] = []

    def make(watch_timeout_seconds: int = 30, page_size: int = 500) -> PodWatcher:
        watcher = PodWatcher(
            connection,
            NODE,
            watch_timeout_seconds=watch_timeout_seconds,
            backoff_initial=0.05,
            backoff_max=0.2,
            page_size=page_size,
        )
        watchers.append(watcher)
        watcher.start()
        return watcher

    yield make
    for watcher in watchers:
        watcher.stop()


def names(watcher: PodWatcher) -> list[str]:
    return [f"{pod.namespace}/{pod.name}" for pod in watcher.snapshot()]


def test_lists_only_this_nodes_pods_with_their_gpus(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    watcher = make_watcher()

    assert watcher.wait_until_synced(5)
    pods = {pod.name: pod for pod in watcher.snapshot()}
    assert set(pods) == {"trainer-0", "frontend"}
    trainer = pods["trainer-0"]
    assert trainer.uid == apiserver.pod("ml", "trainer-0")["metadata"]["uid"]
    assert (trainer.namespace, trainer.node, trainer.phase) == ("ml", NODE, "Running")
    assert trainer.start_time == STARTED
    assert (trainer.gpu_requests, trainer.gpu_limits, trainer.uses_gpus) == (2, 2, True)
    assert not pods["frontend"].uses_gpus
    lists = apiserver.requests(method="GET", path=PODS_PATH)
    assert lists[0].query["fieldSelector"] == f"spec.nodeName={NODE}"


def test_watch_applies_added_modified_and_deleted(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    watcher = make_watcher()
    assert watcher.wait_until_synced(5)

    apiserver.add_pod(pod_manifest("ml", "trainer-1", NODE, gpus=1, phase="Pending"))
    assert wait_until(lambda: "ml/trainer-1" in names(watcher))

    def running(pod: dict[str, Any]) -> None:
        pod["status"]["phase"] = "Running"

    apiserver.update_pod("ml", "trainer-1", running)
    assert wait_until(
        lambda: any(p.name == "trainer-1" and p.phase == "Running" for p in watcher.snapshot())
    )

    apiserver.delete_pod("web", "frontend")
    assert wait_until(lambda: names(watcher) == ["ml/trainer-0", "ml/trainer-1"])
    assert watcher.relists == 1
    watch = [r for r in apiserver.requests(path=PODS_PATH) if r.query.get("watch")]
    assert watch[0].query["resourceVersion"].isdigit()
    assert watch[0].query["fieldSelector"] == f"spec.nodeName={NODE}"


def test_gone_during_watch_relists_and_drops_pods_missed_meanwhile(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    watcher = make_watcher()
    assert watcher.wait_until_synced(5)
    assert wait_until(lambda: apiserver.open_watches == 1)

    # A deletion the watch never hears about, then the server expires the history (410).
    apiserver.delete_pod_quietly("web", "frontend")
    apiserver.break_watches_with_gone()

    assert wait_until(lambda: watcher.relists == 2)
    assert names(watcher) == ["ml/trainer-0"]
    apiserver.add_pod(pod_manifest("ml", "after", NODE))
    assert wait_until(lambda: "ml/after" in names(watcher))


def test_resuming_from_expired_version_relists(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    watcher = make_watcher(watch_timeout_seconds=1)
    assert watcher.wait_until_synced(5)
    assert wait_until(lambda: apiserver.open_watches == 1)
    apiserver.expire_history()  # the open watch ends after 1 s; resuming gets 410 Gone

    assert wait_until(lambda: watcher.relists == 2, timeout=5)
    watches = [r for r in apiserver.requests(path=PODS_PATH) if r.query.get("watch")]
    assert len(watches) >= 2  # the first watch ended by its timeout, the second got 410
    apiserver.add_pod(pod_manifest("ml", "after", NODE))
    assert wait_until(lambda: "ml/after" in names(watcher))


def test_bookmark_moves_the_resume_version(apiserver: StandInApiServer, make_watcher: Any) -> None:
    watcher = make_watcher(watch_timeout_seconds=1)
    assert watcher.wait_until_synced(5)
    assert wait_until(lambda: apiserver.open_watches == 1)

    # Changes elsewhere in the cluster advance the version; only a bookmark tells this watch.
    apiserver.add_pod(pod_manifest("ml", "far-away", "node-b"))
    version = apiserver.send_bookmark()

    def watches() -> list[str]:
        requests = apiserver.requests(path=PODS_PATH)
        return [r.query["resourceVersion"] for r in requests if r.query.get("watch")]

    assert wait_until(lambda: len(watches()) >= 2, timeout=5)
    assert watches()[1] == str(version)
    assert watches()[0] != str(version)
    assert watcher.relists == 1


@pytest.mark.parametrize("status", [500, 403, 410])
def test_list_errors_back_off_and_recover(
    apiserver: StandInApiServer,
    make_watcher: Any,
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    apiserver.fail("GET", PODS_PATH, status, times=3)

    watcher = make_watcher()

    assert watcher.wait_until_synced(5)
    assert names(watcher) == ["ml/trainer-0", "web/frontend"]
    assert len(apiserver.requests(method="GET", path=PODS_PATH)) >= 4
    assert caplog.text.count(f"pod watch on {NODE} failed (HTTP {status}") == 3
    assert apiserver.token not in caplog.text


def test_the_list_is_paged_and_the_pages_are_one_snapshot(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    for index in range(5):
        apiserver.add_pod(pod_manifest("batch", f"job-{index}", NODE))
    apiserver.clear_requests()
    watcher = make_watcher(page_size=3)

    assert watcher.wait_until_synced(5)
    lists = [r for r in apiserver.requests(path=PODS_PATH) if not r.query.get("watch")]
    assert [r.query["limit"] for r in lists] == ["3", "3", "3"]  # 7 pods on the node
    assert "continue" not in lists[0].query
    assert all(r.query["continue"] for r in lists[1:])
    assert len(names(watcher)) == 7
    assert watcher.relists == 1


def test_a_list_whose_continue_token_expired_starts_over(
    apiserver: StandInApiServer, connection: KubeConnection
) -> None:
    for index in range(5):
        apiserver.add_pod(pod_manifest("batch", f"job-{index}", NODE))
    apiserver.clear_requests()

    class CompactedAfterTheFirstPage(KubeConnection):
        """The real connection; the server forgets its paged lists after the first page."""

        def get_json(self, path: str, **kwargs: Any) -> dict[str, Any]:
            document = super().get_json(path, **kwargs)
            if len(apiserver.requests(path=PODS_PATH)) == 1:
                apiserver.expire_list_tokens()
            return document

    expiring = CompactedAfterTheFirstPage(connection.api_client, connection.request_timeout)
    watcher = PodWatcher(expiring, NODE, page_size=3)
    watcher._relist()

    assert len(names(watcher)) == 7
    lists = apiserver.requests(path=PODS_PATH)
    # The first page, its continuation (410 Expired), then the three pages again.
    assert ["continue" in r.query for r in lists] == [False, True, False, True, True]


class EndlessPages(KubeConnection):
    """The real connection's client, but every list page names a next page: ``tokens`` gives
    the continue tokens (the same one again, or new ones without end)."""

    def __init__(self, connection: KubeConnection, tokens: Iterator[str]) -> None:
        super().__init__(connection.api_client, connection.request_timeout)
        self.tokens = tokens
        self.pages = 0

    def get_json(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self.pages += 1
        return {"metadata": {"resourceVersion": "7", "continue": next(self.tokens)}, "items": []}


def test_a_list_repeating_its_continue_token_fails_at_the_repeat(
    connection: KubeConnection,
) -> None:
    endless = EndlessPages(connection, itertools.repeat("same"))
    watcher = PodWatcher(endless, NODE)

    with pytest.raises(ListPagingError, match="repeated a continue token on page 2"):
        watcher._relist()
    assert endless.pages == 2
    assert not watcher.wait_until_synced(0)


def test_a_list_without_end_fails_after_max_pages_and_backs_off(
    connection: KubeConnection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    endless = EndlessPages(connection, (f"token-{n}" for n in itertools.count()))
    watcher = PodWatcher(endless, NODE, max_pages=5, backoff_initial=0.05, backoff_max=0.05)
    watcher.start()
    try:
        assert wait_until(lambda: caplog.text.count("did not end after 5 pages") >= 2)
    finally:
        watcher.stop()

    assert (
        f"pod watch on {NODE} failed (ListPagingError: the pod list did not end after 5 pages"
        in caplog.text
    )
    assert endless.pages % 5 == 0  # whole lists of 5 pages, each followed by a back-off
    assert not watcher.wait_until_synced(0)


def test_hung_list_times_out_and_recovers(apiserver: StandInApiServer, make_watcher: Any) -> None:
    apiserver.hang("GET", PODS_PATH, seconds=8, times=1)
    started = time.monotonic()

    watcher = make_watcher()

    assert watcher.wait_until_synced(8)
    assert time.monotonic() - started < 5  # 1 s read timeout + back-off, not the 8 s hang
    assert names(watcher) == ["ml/trainer-0", "web/frontend"]


def test_stop_returns_promptly_during_an_open_watch(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    watcher = make_watcher(watch_timeout_seconds=30)
    assert watcher.wait_until_synced(5)
    assert wait_until(lambda: apiserver.open_watches == 1)

    started = time.monotonic()
    watcher.stop(timeout=10)

    # Without interrupting the read, the thread would sit out the 30 s watch.
    assert time.monotonic() - started < 5
    assert not watcher._thread.is_alive()


def test_pod_info_counts_init_containers_limits_and_container_ids() -> None:
    manifest = pod_manifest("ml", "p", NODE)
    gpu = "nvidia.com/gpu"
    manifest["spec"]["containers"] = [
        {"name": "a", "resources": {"limits": {gpu: "1"}}},  # requests default to limits
        {"name": "b", "resources": {"requests": {gpu: "2"}, "limits": {gpu: "2"}}},
        {"name": "c"},
    ]
    manifest["spec"]["initContainers"] = [
        {"name": "warmup", "resources": {"limits": {gpu: "4"}, "requests": {gpu: "4"}}}
    ]
    manifest["status"]["containerStatuses"] = [
        {"name": "a", "containerID": "containerd://abc123"},
        {"name": "b"},
    ]
    del manifest["status"]["startTime"]

    info = pod_info(manifest)

    assert isinstance(info, PodInfo)
    assert (info.gpu_requests, info.gpu_limits) == (4, 4)
    assert dict(info.container_ids) == {"abc123": "a"}
    assert info.start_time is None


def test_pod_info_keeps_the_controller_and_the_workload_labels_only() -> None:
    manifest = pod_manifest("ml", "web-7d9c-x2", NODE, gpus=1)
    manifest["metadata"]["ownerReferences"] = [
        {"kind": "Node", "name": NODE},  # a mirror pod's owner, not its controller
        {"kind": "ReplicaSet", "name": "web-7d9c", "controller": True},
    ]
    manifest["metadata"]["labels"] = {
        "pod-template-hash": "7d9c",
        "app": "web",
        "serving.kserve.io/inferenceservice": "web",
    }

    info = pod_info(manifest)

    assert (info.owner_kind, info.owner_name) == ("ReplicaSet", "web-7d9c")
    assert dict(info.labels) == {
        "pod-template-hash": "7d9c",
        "serving.kserve.io/inferenceservice": "web",
    }
    assert (pod_info(pod_manifest("ml", "bare", NODE)).owner_kind, info.phase) == ("", "Running")


def test_pod_without_uid_is_skipped_not_fatal(
    apiserver: StandInApiServer, make_watcher: Any
) -> None:
    broken = pod_manifest("ml", "broken", NODE)
    del broken["metadata"]["uid"]
    apiserver.add_pod(broken)

    watcher = make_watcher()
    assert watcher.wait_until_synced(5)
    apiserver.add_pod(pod_manifest("ml", "fine", NODE))

    assert wait_until(lambda: "ml/fine" in names(watcher))
    assert "ml/broken" not in names(watcher)


def test_listed_is_none_until_the_first_list_and_keeps_only_the_asked_annotations(
    apiserver: StandInApiServer, connection: KubeConnection
) -> None:
    apiserver.update_pod(
        "ml",
        "trainer-0",
        lambda pod: pod["metadata"]["annotations"].update(
            {"karpenter.sh/do-not-disrupt": "true", "kubectl.kubernetes.io/last-applied": "{}"}
        ),
    )
    apiserver.hang("GET", PODS_PATH, 1.0, times=1)
    watcher = PodWatcher(
        connection, NODE, backoff_initial=0.05, annotation_keys=["karpenter.sh/do-not-disrupt"]
    )
    watcher.start()
    try:
        assert watcher.listed() is None  # not "no pods": nothing is known yet
        assert watcher.wait_until_synced(5)
        listed = {pod.name: pod for pod in watcher.listed() or []}
    finally:
        watcher.stop()
    assert listed["trainer-0"].annotations == {"karpenter.sh/do-not-disrupt": "true"}
    assert listed["frontend"].annotations == {}
