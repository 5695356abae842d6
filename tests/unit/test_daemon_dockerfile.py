"""The container image, checked statically: no Docker engine can run here.

The Dockerfile is parsed into stages and instructions and checked for what the deployment
relies on (non-root uid 65532, the ``gpu-profiler run`` entrypoint, port 9401, no build tools or
dev extras in the final stage). The slow test rebuilds the wheel from exactly what the builder
stage copies, as its ``pip wheel`` step does.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [argument for name, argument in self.instructions if name == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages with their instructions; continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, argument = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = argument.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{keyword} before FROM"
            stages[-1].instructions.append((keyword, argument.strip()))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def test_multi_stage_on_slim_python(stages: list[Stage]) -> None:
    assert len(stages) == 2
    builder, final = stages
    assert builder.name == "builder"
    assert builder.base == final.base
    tag, _, digest = builder.base.partition("@")
    assert tag == "python:3.11-slim-bookworm"  # the tag kept for people, the digest for pulls
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), builder.base
    assert any(argument.startswith("--from=builder ") for argument in final.all("COPY"))


def test_final_stage_runs_gpu_profiler_as_non_root(stages: list[Stage]) -> None:
    final = stages[-1]
    assert final.all("USER") == ["65532:65532"]
    # USER comes after every RUN, so nothing later runs as root.
    keywords = [name for name, _ in final.instructions]
    assert keywords.index("USER") > max(i for i, name in enumerate(keywords) if name == "RUN")
    assert json.loads(final.all("ENTRYPOINT")[0]) == ["gpu-profiler"]
    assert json.loads(final.all("CMD")[0]) == ["run"]
    assert final.all("EXPOSE") == ["9401"]
    environment = " ".join(final.all("ENV"))
    assert "XDG_DATA_HOME=/var/lib" in environment  # the SQLite store: /var/lib/gpu-profiler
    assert "OPENBLAS_NUM_THREADS=1" in environment
    assert "install -d -o 65532 -g 65532" in final.all("RUN")[0]


def test_no_build_tools_or_dev_extras(stages: list[Stage]) -> None:
    text = " ".join(argument for stage in stages for _, argument in stage.instructions)
    for extra in ("[dev", "[infra", "[ansible", ",dev", ",infra", ",ansible"):
        assert extra not in text
    assert "[postgres]" in text
    final_runs = " ".join(stages[-1].all("RUN"))
    for tool in ("apt-get", "gcc", "build-essential", "pip "):
        assert tool not in final_runs


def compileall_command(stage: Stage) -> list[str]:
    """The final stage's ``python -m compileall ...`` words."""
    for run in stage.all("RUN"):
        for command in run.split("&&"):
            words = shlex.split(command)
            if words[:3] == ["python", "-m", "compileall"]:
                return words
    raise AssertionError("the final stage compiles no bytecode")


def test_final_stage_compiles_the_standard_library_it_runs(stages: list[Stage]) -> None:
    """The base image ships the standard library without bytecode and the root filesystem is
    read-only, so the final stage compiles it; what it leaves out no command imports."""
    words = compileall_command(stages[-1])
    version = stages[-1].base.partition("@")[0].removeprefix("python:").split("-")[0]
    stdlib = f"/usr/local/lib/python{version}"
    assert words[-1] == stdlib  # the base image's own interpreter, the one the venv runs on
    left_out = re.compile(words[words.index("-x") + 1])
    for package in ("idlelib", "tkinter", "lib2to3", "site-packages"):
        assert left_out.search(f"{stdlib}/{package}/__init__.py"), package
    # Every module of the profiler, imported as a command or the daemon would (a superset):
    # the standard library files that loads, as they lie in the image.
    probe = (
        "import importlib, pkgutil, sys, sysconfig, profiler_app\n"
        "for m in pkgutil.walk_packages(profiler_app.__path__, 'profiler_app.'):\n"
        "    if not m.name.endswith('__main__'):  # that one runs the CLI\n"
        "        importlib.import_module(m.name)\n"
        "root = sysconfig.get_paths()['stdlib'] + '/'\n"
        "for module in list(sys.modules.values()):\n"
        "    path = getattr(module, '__file__', None) or ''\n"
        "    if path.startswith(root) and path.endswith('.py'):\n"
        "        print(path[len(root):])\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(loaded) > 100  # a real probe: the daemon loop alone loads 150
    assert "asyncio/base_events.py" in loaded
    compiled = [path for path in loaded if not left_out.search(f"{stdlib}/{path}")]
    assert compiled == loaded, sorted(set(loaded) - set(compiled))


def test_builder_copies_only_what_exists_and_dockerignore_keeps_it(stages: list[Stage]) -> None:
    copied = copied_paths(stages[0])
    assert copied == ["pyproject.toml", "README.md", "constraints/image.txt", "profiler_app"]
    for path in copied:
        assert (ROOT / path).exists(), path
        assert not ignored(path)
    for path in (".venv", "tests", ".git", "infra", "profiler_app/__pycache__/x.pyc"):
        assert ignored(path), path


def test_the_image_installs_its_hashed_lock_and_fetches_nothing_else(stages: list[Stage]) -> None:
    (install,) = [run for run in stages[0].all("RUN") if "pip install" in run]
    commands = [command.strip() for command in install.split("&&")]
    pips = [command for command in commands if " install " in command or " wheel " in command]
    assert "pip install --require-hashes --no-deps -r constraints/image.txt" in pips[0]
    assert "--no-build-isolation" in pips[1]  # else pip fetches an unpinned setuptools to build
    assert all("--no-index" in command for command in pips[2:])
    assert any(command.endswith("pip check") for command in commands)
    assert "constraints/image.txt" in copied_paths(stages[0])


def lock_entries() -> dict[str, tuple[Version, list[str]]]:
    """constraints/image.txt: name -> (version, sha256 hashes); continuation lines joined."""
    text = (ROOT / "constraints" / "image.txt").read_text()
    logical = " ".join(
        line.strip() for line in text.splitlines() if not line.startswith("#")
    ).replace("\\ ", "")
    entries = {}
    for requirement in re.split(r"\s+(?=[A-Za-z0-9][A-Za-z0-9._-]*==)", logical.strip()):
        words = requirement.split()
        name, _, number = words[0].partition("==")
        assert number, f"not a pin: {requirement!r}"
        hashes = [word.removeprefix("--hash=sha256:") for word in words[1:]]
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), requirement
        entries[canonicalize_name(name)] = (Version(number), hashes)
    return entries


def image_pins() -> dict[str, Version]:
    return {name: version for name, (version, _) in lock_entries().items()}


def test_every_pin_has_hashes() -> None:
    entries = lock_entries()
    assert len(entries) > 40  # the runtime's whole resolution, not a parse that found nothing
    assert [name for name, (_, hashes) in entries.items() if not hashes] == []


def test_every_runtime_dependency_is_pinned_at_or_above_its_floor() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        Requirement(text)
        for text in [*project["dependencies"], *project["optional-dependencies"]["postgres"]]
    ]
    pins = image_pins()
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in constraints/image.txt"
        assert requirement.specifier.contains(pins[name]), f"{name} {pins[name]} < its floor"
    assert pins["psycopg-binary"] == pins["psycopg"]  # the [binary] extra wants the same release


@pytest.mark.slow
def test_the_pins_are_the_whole_resolution(tmp_path: Path) -> None:
    """pip resolves the image's install with the pins (needs PyPI): nothing is left unpinned."""
    report = tmp_path / "report.json"
    pins = tmp_path / "pins.txt"  # hashes in a constraints file would demand them of "." too
    pins.write_text("".join(f"{name}=={version}\n" for name, version in image_pins().items()))
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", str(report), "--constraint", str(pins), ".[postgres]"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if completed.returncode != 0 and "NewConnectionError" in completed.stderr:
        pytest.skip("PyPI unreachable")
    assert completed.returncode == 0, completed.stderr[-2000:]
    resolved = {
        canonicalize_name(item["metadata"]["name"]): Version(item["metadata"]["version"])
        for item in json.loads(report.read_text())["install"]
    }
    resolved.pop("gpu-cluster-profiler")
    pinned = image_pins()
    assert pinned.pop("setuptools")  # builds the wheel, removed after
    assert resolved == pinned


def copied_paths(stage: Stage) -> list[str]:
    paths = []
    for argument in stage.all("COPY"):
        words = shlex.split(argument)
        assert not words[0].startswith("--"), "the builder copies from the build context only"
        paths.extend(words[:-1])
    return paths


def ignored(path: str) -> bool:
    """.dockerignore semantics for our simple patterns: the last matching pattern wins."""
    verdict = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        candidates = [path, *("/".join(path.split("/")[: i + 1]) for i in range(path.count("/")))]
        if any(
            fnmatch.fnmatch(c, pattern) or fnmatch.fnmatch(c, pattern.replace("**/", "*/"))
            for c in candidates
        ):
            verdict = not negate
    return verdict


@pytest.mark.slow
def test_builder_context_builds_a_wheel_with_the_daemon(
    stages: list[Stage], tmp_path: Path
) -> None:
    """Runs the builder's ``pip wheel`` step on the copied paths (needs PyPI for setuptools)."""
    context = tmp_path / "context"
    context.mkdir()
    for path in copied_paths(stages[0]):
        source = ROOT / path
        if source.is_dir():
            shutil.copytree(source, context / path, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, context / path)
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if completed.returncode != 0 and "NewConnectionError" in completed.stderr:
        pytest.skip("PyPI unreachable: cannot fetch the build backend")
    assert completed.returncode == 0, completed.stderr[-2000:]
    (wheel,) = tmp_path.glob("gpu_cluster_profiler-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "gpu-profiler = profiler_app.cli:main" in archive.read(entry_points).decode()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    for module in ("daemon/loop.py", "commands/run.py", "sources/nvml.py", "sinks/metrics.py"):
        assert f"profiler_app/{module}" in names
    assert any(name.startswith("profiler_app/sinks/store/migrations/versions/") for name in names)
    assert "Provides-Extra: postgres" in metadata
    # The SPDX license string: no setuptools deprecation warning for the old table form.
    assert "License-Expression: Apache-2.0" in metadata
    output = completed.stdout + completed.stderr
    assert "Building wheel" in output  # -v shows the build backend's own output
    assert "SetuptoolsDeprecationWarning" not in output
    assert not any(name.startswith(("tests/", "infra/")) for name in names)
