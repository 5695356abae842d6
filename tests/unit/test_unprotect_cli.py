"""``gpu-profiler unprotect`` against the stand-in API server (a test double, see
tests/support/apiserver/): every node's pods, only the profiler's marks, ``--dry-run``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_app.cli import main
from tests.support.apiserver.objects import pod_manifest
from tests.support.apiserver.server import StandInApiServer, running_apiserver

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
MARKER = "ai.centaurus.io/do-not-disrupt"
POD_ANNOTATIONS = {
    "ours-a": {DO_NOT_DISRUPT: "true", MARKER: "training", "keep": "me"},
    "ours-b": {DO_NOT_DISRUPT: "true", MARKER: "owner"},
    "persons": {DO_NOT_DISRUPT: "true"},
    "said-no": {DO_NOT_DISRUPT: "false", MARKER: "training"},  # a person changed the value
    "plain": {},
}
RELEASED = {
    "ours-a": {"keep": "me"},
    "ours-b": {},
    "persons": {DO_NOT_DISRUPT: "true"},
    "said-no": {DO_NOT_DISRUPT: "false"},
    "plain": {},
}


@pytest.fixture
def apiserver() -> Iterator[StandInApiServer]:
    with running_apiserver() as server:
        for name, annotations in POD_ANNOTATIONS.items():
            node = "node-b" if name == "ours-b" else "node-a"
            server.add_pod(pod_manifest("ml", name, node, gpus=1, annotations=annotations))
        yield server


@pytest.fixture
def kubeconfig(apiserver: StandInApiServer, tmp_path: Path, cli_environment: None) -> str:
    return str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))


def annotations(apiserver: StandInApiServer) -> dict[str, dict[str, str]]:
    return {
        name: dict(apiserver.pod("ml", name)["metadata"]["annotations"]) for name in POD_ANNOTATIONS
    }


def test_dry_run_lists_the_profilers_marks_and_changes_nothing(
    apiserver: StandInApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["unprotect", "--kubeconfig", kubeconfig, "--dry-run"]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out == [
        "would remove karpenter.sh/do-not-disrupt and the marker from ml/ours-a (node node-a)",
        "would remove karpenter.sh/do-not-disrupt and the marker from ml/ours-b (node node-b)",
        "would remove the marker (the do-not-disrupt there is not the profiler's) from "
        "ml/said-no (node node-a)",
        "3 pod(s) carry the profiler's marker; dry run: nothing changed",
    ]
    assert annotations(apiserver) == POD_ANNOTATIONS
    assert apiserver.requests("PATCH") == []


def test_removes_only_the_profilers_marks_on_every_node(
    apiserver: StandInApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["unprotect", "--kubeconfig", kubeconfig]) == 0

    assert annotations(apiserver) == RELEASED
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "3 pod(s) carried the profiler's marker: 3 released, 0 failed"
    (listing,) = [r for r in apiserver.requests("GET") if r.path == "/api/v1/pods"]
    assert "fieldSelector" not in listing.query  # every node
    assert main(["unprotect", "--kubeconfig", kubeconfig]) == 0  # nothing left: idempotent
    assert capsys.readouterr().out == "no pod carries the profiler's marker\n"


def test_node_and_domain_narrow_what_is_released(
    apiserver: StandInApiServer, kubeconfig: str
) -> None:
    assert main(["unprotect", "--kubeconfig", kubeconfig, "--node", "node-b"]) == 0
    assert annotations(apiserver)["ours-b"] == {}
    assert annotations(apiserver)["ours-a"] == POD_ANNOTATIONS["ours-a"]

    assert main(["unprotect", "--kubeconfig", kubeconfig, "--annotation-domain", "x.io"]) == 0
    assert annotations(apiserver)["ours-a"] == POD_ANNOTATIONS["ours-a"]  # not x.io's marker


def test_a_pod_that_refuses_is_reported_and_the_others_released(
    apiserver: StandInApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.fail("PATCH", "/api/v1/namespaces/ml/pods/ours-a", 403)

    assert main(["unprotect", "--kubeconfig", kubeconfig]) == 1

    captured = capsys.readouterr()
    assert captured.err == (
        "gpu-profiler: could not release ml/ours-a (node node-a): HTTP 403 Forbidden\n"
    )
    assert captured.out.splitlines()[-1] == (
        "3 pod(s) carried the profiler's marker: 2 released, 1 failed"
    )
    assert annotations(apiserver)["ours-b"] == {}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "no cluster to talk to: give --kubeconfig FILE"),
        (["--annotation-domain", "Bad Domain"], "annotation domain"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    cli_environment: None,
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    message: str,
) -> None:
    assert main(["unprotect", *arguments]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-profiler: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_a_list_the_server_refuses_is_one_line_and_exit_2(
    apiserver: StandInApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.fail("GET", "/api/v1/pods", 403)
    assert main(["unprotect", "--kubeconfig", kubeconfig]) == 2
    assert capsys.readouterr().err == (
        "gpu-profiler: error: cannot list the pods: HTTP 403 Forbidden\n"
    )
