"""The smoke and image workflows (.github/workflows), checked without GitHub.

actionlint lints them for real (scripts/test runs it too), including a broken copy that it must
reject; the rest reads the workflow documents for what CI needs of them: triggers, OIDC
credentials, teardown whatever happens, one run at a time, least privilege, pinned actions, and
an image tag that matches what the stacks deploy.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import versions

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT = Path(sys.executable).parent / "actionlint"
# An action by the commit of its release, the release named for people: a tag can be moved to
# other code by whoever controls the action's repository; a commit cannot.
PINNED = re.compile(r"^\s*(- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}  # v\d+\.\d+\.\d+\b")
PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    return document


def steps(workflow: dict[str, Any], job: str) -> list[dict[str, Any]]:
    return list(workflow["jobs"][job]["steps"])


def step_named(workflow: dict[str, Any], job: str, text: str) -> tuple[int, dict[str, Any]]:
    for index, step in enumerate(steps(workflow, job)):
        if text in step.get("name", "") or text in step.get("run", ""):
            return index, step
    raise AssertionError(f"no step of {job} mentions {text!r}")


def actionlint(*arguments: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    if not ACTIONLINT.exists():
        pytest.fail(f"actionlint is not installed beside {sys.executable} (the dev extra has it)")
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", "-oneline", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_actionlint_accepts_the_workflows() -> None:
    result = actionlint()
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_rejects_a_workflow_with_a_broken_expression(tmp_path: Path) -> None:
    """The lint is real: a typo in a step reference and in a status function are errors."""
    text = (WORKFLOWS / "smoke.yml").read_text().replace("if: always()", "if: allways()", 1)
    image = (WORKFLOWS / "image.yml").read_text().replace("steps.version.", "steps.versoin.", 1)
    (tmp_path / "smoke.yml").write_text(text)
    (tmp_path / "image.yml").write_text(image)
    result = actionlint("smoke.yml", "image.yml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'undefined function "allways"' in result.stdout
    assert 'property "versoin" is not defined' in result.stdout


def unpinned_actions(text: str) -> list[str]:
    """The ``uses:`` lines of a workflow not pinned by commit SHA with their release beside."""
    return [
        line.strip()
        for line in text.splitlines()
        if re.match(r"^\s*(- )?uses:", line) and not PINNED.match(line)
    ]


@pytest.mark.parametrize("name", ["smoke.yml", "image.yml"])
def test_actions_are_pinned_by_commit_and_permissions_are_read_only_at_the_top(
    name: str,
) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {"contents": "read"}
    text = (WORKFLOWS / name).read_text()
    assert unpinned_actions(text) == []
    uses = [
        step["uses"] for job in workflow["jobs"] for step in steps(workflow, job) if "uses" in step
    ]
    assert uses, "no action found: the check would pass on anything"
    assert text.count("uses:") == len(uses)  # every step's action was seen by the line check


def test_the_pin_check_fails_on_a_tag_or_a_branch() -> None:
    sha = "11bd71901bbe5b1630ceea73d27597364c9af683"
    assert unpinned_actions(f"      - uses: actions/checkout@{sha}  # v4.2.2") == []
    for line in (
        "      - uses: actions/checkout@v4.2.2",
        "      - uses: actions/checkout@main",
        f"        uses: actions/checkout@{sha}",  # no release named for people
        f"      - uses: actions/checkout@{sha[:12]}  # v4.2.2",
    ):
        assert unpinned_actions(line) == [line.strip()]


def test_smoke_workflow_runs_weekly_and_on_demand_one_at_a_time() -> None:
    workflow = load("smoke.yml")
    triggers = workflow["on"]
    assert set(triggers) == {"workflow_dispatch", "schedule"}
    assert len(triggers["schedule"]) == 1
    _minute, _hour, day, month, weekday = triggers["schedule"][0]["cron"].split()
    assert (day, month) == ("*", "*"), "weekly"
    assert weekday.isdigit(), "weekly"
    assert workflow["concurrency"] == {"group": "cluster-smoke", "cancel-in-progress": False}


def test_smoke_workflow_deploys_checks_and_always_destroys() -> None:
    workflow = load("smoke.yml")
    job = workflow["jobs"]["smoke"]
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    _, up = step_named(workflow, "smoke", "pulumi up --yes")
    assert up["env"]["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
    credentials = [
        step
        for step in steps(workflow, "smoke")
        if step.get("uses", "").startswith("aws-actions/configure-aws-credentials@")
    ]
    assert credentials
    assert all("role-to-assume" in step["with"] for step in credentials)
    assert all("aws-access-key-id" not in step["with"] for step in credentials)
    up, _ = step_named(workflow, "smoke", "pulumi up --yes")
    suite, smoke = step_named(workflow, "smoke", "pytest tests/smoke/checks")
    upload, artifact = step_named(workflow, "smoke", "JUnit")
    destroy, teardown = step_named(workflow, "smoke", "pulumi destroy --yes")
    assert up < suite < upload < destroy
    assert "--junitxml smoke-junit.xml" in smoke["run"]
    assert artifact["if"] == "always()"
    assert artifact["with"]["path"] == "smoke-junit.xml"
    assert teardown["if"] == "always()"
    assert teardown["working-directory"] == "stacks/eks"


def test_image_workflow_tests_both_architectures_on_their_own_runners() -> None:
    """GPU node groups may be arm64 (AL2023_ARM_64_NVIDIA): every change to
    the image is built and run on an arm64 runner as well as an amd64 one."""
    workflow = load("image.yml")
    triggers = workflow["on"]
    assert triggers["push"]["tags"] == ["v*"]
    assert "Dockerfile" in triggers["pull_request"]["paths"]
    assert "profiler_app/**" in triggers["pull_request"]["paths"]
    job = workflow["jobs"]["test"]
    assert job["permissions"] == {"contents": "read"}
    matrix = {
        m["platform"]: (m["runner"], m["machine"]) for m in job["strategy"]["matrix"]["include"]
    }
    assert matrix == {
        "linux/amd64": ("ubuntu-24.04", "x86_64"),
        "linux/arm64": ("ubuntu-24.04-arm", "aarch64"),
    }
    assert job["runs-on"] == "${{ matrix.runner }}"
    build = next(s for s in job["steps"] if "docker/build-push-action" in s.get("uses", ""))
    assert build["with"]["platforms"] == "${{ matrix.platform }}"
    assert build["with"]["push"] is False
    _, run = step_named(workflow, "test", "docker run --rm gpu-profiler:test --version")
    assert "platform.machine()" in run["run"]
    assert run["env"]["MACHINE"] == "${{ matrix.machine }}"


def test_image_workflow_pushes_a_signed_multi_arch_image_with_an_sbom_on_version_tags() -> None:
    workflow = load("image.yml")
    job = workflow["jobs"]["release"]
    assert job["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert job["needs"] == "test"
    # Only this job writes packages, and asks for an OIDC token (cosign's keyless signature).
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    assert workflow["jobs"]["test"]["permissions"] == {"contents": "read"}
    _, check = step_named(workflow, "release", "scripts/release_version.py")
    assert check["id"] == "version"
    build = next(
        step for step in job["steps"] if "docker/build-push-action" in step.get("uses", "")
    )
    assert build["with"]["push"] is True
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["sbom"] is True
    repository = versions.PROFILER_IMAGE.rsplit(":", 1)[0]
    assert build["with"]["tags"] == f"{repository}:${{{{ steps.version.outputs.version }}}}"
    uses = [step.get("uses", "").split("@")[0] for step in job["steps"]]
    assert uses.index("docker/setup-qemu-action") < uses.index("docker/build-push-action")
    assert uses.index("docker/build-push-action") < uses.index("sigstore/cosign-installer")
    _, sign = step_named(workflow, "release", "cosign sign")
    # By digest, not tag: what is signed is exactly what was pushed.
    assert sign["run"] == f'cosign sign --yes "{repository}@${{DIGEST}}"'
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert build["id"] == "build"
    # The stacks' default image is the one this workflow pushes for the project's version.
    assert versions.PROFILER_IMAGE.endswith(f":{PROJECT_VERSION}")


def test_the_smoke_workflows_session_outlasts_the_job() -> None:
    """The default one-hour OIDC session would end mid-run."""
    workflow = load("smoke.yml")
    job = workflow["jobs"]["smoke"]
    first = next(
        step
        for step in steps(workflow, "smoke")
        if step.get("uses", "").startswith("aws-actions/configure-aws-credentials@")
    )
    assert int(first["with"]["role-duration-seconds"]) >= job["timeout-minutes"] * 60


@pytest.mark.parametrize(
    ("tag", "status", "output"),
    [
        (f"v{PROJECT_VERSION}", 0, f"version={PROJECT_VERSION}\n"),
        ("v99.0.0", 1, ""),
        (PROJECT_VERSION, 1, ""),
    ],
)
def test_release_version_accepts_only_the_tag_of_the_project_version(
    tag: str, status: int, output: str
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "release_version.py"), tag],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout) == (status, output)
    if status:
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith("error: ")
        assert f"v{PROJECT_VERSION}" in result.stderr


def test_the_smoke_job_installs_from_the_hashed_lock_before_any_secret() -> None:
    workflow = load("smoke.yml")
    job = (
        workflow["jobs"]["smoke"]
        if "smoke" in workflow["jobs"]
        else next(iter(workflow["jobs"].values()))
    )
    assert "PULUMI_ACCESS_TOKEN" not in job.get("env", {})  # only the steps that run pulumi
    install_at, install = step_named(workflow, next(iter(workflow["jobs"])), "pip install")
    commands = [line.strip() for line in install["run"].splitlines() if "pip install" in line]
    assert commands[0].endswith("pip install --require-hashes --no-deps -r constraints/smoke.txt")
    assert all("--no-index" in command or "--require-hashes" in command for command in commands)
    assert "env" not in install
    steps_with_token = [
        index
        for index, step in enumerate(steps(workflow, "smoke"))
        if "PULUMI_ACCESS_TOKEN" in step.get("env", {})
    ]
    assert steps_with_token
    assert min(steps_with_token) > install_at
    assert "--hash=sha256:" in (ROOT / "constraints" / "smoke.txt").read_text()


def test_a_pull_request_runs_the_readmes_test_command() -> None:
    workflow = load("test.yml")
    assert "pull_request" in workflow["on"]
    assert workflow["permissions"] == {"contents": "read"}
    (job,) = workflow["jobs"]
    uses = [s["uses"] for s in steps(workflow, job) if "uses" in s]
    assert uses
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses
    _, run = step_named(workflow, job, "scripts/test")
    assert run["run"].split()[-1] == "scripts/test"  # alone: every check, as the README says
