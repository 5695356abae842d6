"""The declared minimum versions as a pip constraints file, one ``name==version`` a line.

Reads pyproject.toml: every runtime dependency and the ``postgres`` extra (what the image
installs), plus the test tools of the ``dev`` extra that the profiler's tests need. Each must
declare a ``>=`` floor; scripts/test installs exactly these and runs the profiler's unit tests.

    python scripts/floors.py            # the constraints file
    python scripts/floors.py --tools    # the test tools' names, for pip install
    python scripts/floors.py --check    # every floor is what this interpreter has installed
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis", "pandas")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)")


def floor(requirement: str) -> tuple[str, str]:
    """``("name", "version")`` of a requirement's ``>=`` floor, or ValueError."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise ValueError(f"unreadable requirement {requirement!r}")
    name, specifiers = match.groups()
    for specifier in specifiers.split(","):
        operator, _, number = specifier.strip().partition(">=")
        if not operator and number:
            return name, number.strip()
    raise ValueError(f"{requirement!r} declares no '>=' floor")


def floor_name(requirement: str) -> str:
    match = _REQUIREMENT.match(requirement)
    return match.group(1) if match else ""


def floors(pyproject: dict[str, object]) -> dict[str, str]:
    project = pyproject["project"]
    assert isinstance(project, dict)
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *extras["postgres"]]
    pinned = dict(floor(requirement) for requirement in requirements)
    # The test tools' floors, from the dev extra and the extras it includes (smoke has pytest).
    tool_extras = ("dev", "smoke")
    tools = dict(
        floor(item)
        for extra in tool_extras
        for item in extras[extra]
        if floor_name(item) in TEST_TOOLS
    )
    missing = set(TEST_TOOLS) - set(tools)
    if missing:
        raise ValueError(f"the dev extras declare no floor for {', '.join(sorted(missing))}")
    return pinned | tools


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def check(pinned: dict[str, str]) -> list[str]:
    """What differs between the floors and the installed versions."""
    from packaging.version import Version  # noqa: PLC0415 - pip's own dependency, not stdlib

    problems = []
    for name, number in pinned.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            problems.append(f"{name} is not installed")
            continue
        if Version(installed) != Version(number):
            problems.append(f"{name} {installed} is installed, the floor is {number}")
    return problems


def main(argv: list[str]) -> int:
    pinned = floors(tomllib.loads(PYPROJECT.read_text()))
    if argv == ["--tools"]:
        print(" ".join(TEST_TOOLS))
    elif argv == ["--check"]:
        problems = check(pinned)
        for problem in problems:
            print(f"floors: {problem}", file=sys.stderr)
        return 1 if problems else 0
    elif not argv:
        print("\n".join(f"{_normal(name)}=={number}" for name, number in pinned.items()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
