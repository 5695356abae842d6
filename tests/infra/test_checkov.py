"""checkov over the project's own rendered objects (charts' excluded: their owners' choices) and
the Dockerfile fails nothing but what docs/operations.md ("checkov: accepted findings") lists with
its reason.

checkov is not a dev dependency (a large tree of its own): the test skips without ``checkov`` on
PATH. Run it with one installed apart, e.g. ``pipx install checkov``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.render.__main__ import _publishable, write_folder
from infra.render.graph import build_graph
from infra.render.program import run_stack
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK, REPO_ROOT

pytestmark = pytest.mark.charts

CHECKOV = shutil.which("checkov")
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
# The variants whose own objects differ: the default stores, RDS (its Job), SQLite (hostPath),
# the trial runner.
VARIANTS: dict[str, tuple[Path, dict[str, Any]]] = {
    "eks": (EKS_STACK, {}),
    "eks-rds": (EKS_STACK, {"profilerStore": "rds"}),
    "kubeadm-sqlite-trials": (
        KUBEADM_STACK,
        {"profilerStore": "sqlite", "trialRunner": {"maxGpus": 4}},
    ),
}
ROW = re.compile(r"^\| `(CKV2?_[A-Z0-9_]+)` \| `([^`]+)` \| (.+) \|$")


def accepted() -> dict[tuple[str, str], str]:
    """``(check, resource) -> reason`` from the table in docs/operations.md."""
    text = OPERATIONS.read_text()
    section = text.split("### checkov: accepted findings", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            rows[(match.group(1), match.group(2))] = match.group(3)
    return rows


def failures(*arguments: str) -> set[tuple[str, str]]:
    assert CHECKOV is not None
    completed = subprocess.run(
        [CHECKOV, "--skip-download", "--quiet", "--compact", "-o", "json", *arguments],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert completed.returncode in (0, 1), completed.stderr[-2000:]
    reports = json.loads(completed.stdout or "[]")
    if isinstance(reports, dict):
        reports = [reports]
    return {
        (check["check_id"], _resource(check["resource"]))
        for report in reports
        if isinstance(report, dict) and "results" in report
        for check in report["results"]["failed_checks"]
    }


def _resource(name: str) -> str:
    """checkov's resource name, without what varies from run to run: a graph check's pod names
    its labels in no fixed order (``Pod.<namespace>.<name>`` is kept), a Dockerfile its path."""
    if name.startswith("Pod."):
        return ".".join(name.split(".")[:3])
    if name.rstrip(".").endswith("Dockerfile"):
        return "Dockerfile"
    return name


def test_the_accepted_table_has_reasons() -> None:
    rows = accepted()
    assert rows, "docs/operations.md lists no accepted checkov findings"
    assert all(len(reason.strip()) > 20 for reason in rows.values())


# What checkov fails, per variant and for the Dockerfile, once per session.
_FOUND: dict[str, set[tuple[str, str]]] = {}


def found_in(target: str, folder: Path) -> set[tuple[str, str]]:
    """checkov's failures on a variant's own objects (written under ``folder``) or the
    Dockerfile (``target`` "Dockerfile")."""
    if target not in _FOUND:
        if target == "Dockerfile":
            arguments = ("--framework", "dockerfile", "-f", str(REPO_ROOT / "Dockerfile"))
        else:
            stack, overrides = VARIANTS[target]
            graph = build_graph(run_stack(stack, overrides=overrides))
            own = [(p, obj) for p, obj in _publishable(graph) if not p.startswith("helm/")]
            write_folder(folder / "objects", own)
            arguments = ("--framework", "kubernetes", "-d", str(folder / "objects"))
        _FOUND[target] = failures(*arguments)
    return _FOUND[target]


@pytest.mark.skipif(CHECKOV is None, reason="checkov is not on PATH")
@pytest.mark.parametrize("target", [*sorted(VARIANTS), "Dockerfile"])
def test_checkov_fails_nothing_unaccepted(target: str, tmp_path: Path) -> None:
    assert found_in(target, tmp_path) - set(accepted()) == set()


@pytest.mark.skipif(CHECKOV is None, reason="checkov is not on PATH")
def test_every_accepted_finding_still_occurs(tmp_path: Path) -> None:
    """A finding fixed since is struck from the table, so that it lists only real exceptions."""
    seen = set().union(*(found_in(t, tmp_path / t) for t in [*VARIANTS, "Dockerfile"]))
    assert set(accepted()) - seen == set()
