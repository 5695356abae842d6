"""scripts/floors.py: the declared minimums that scripts/test installs into .venv-min."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def floors() -> ModuleType:
    spec = importlib.util.spec_from_file_location("floors", ROOT / "scripts" / "floors.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["floors"] = module
    spec.loader.exec_module(module)
    return module


def test_every_runtime_dependency_and_test_tool_has_its_floor_pinned(floors: ModuleType) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pinned = floors.floors(pyproject)
    runtime = [*pyproject["project"]["dependencies"], "psycopg[binary]", *floors.TEST_TOOLS]
    assert {floors.floor_name(text) for text in runtime} == set(pinned)
    assert pinned["kubernetes"] == "37.0.0"  # kube.py needs ApiClient.param_serialize


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        ("numpy>=1.26.0", ("numpy", "1.26.0")),
        ("psycopg[binary]>=3.1.4", ("psycopg", "3.1.4")),
        ("ansible-core>=2.16,<2.19", ("ansible-core", "2.16")),
        ("pulumi<4,>=3.130", ("pulumi", "3.130")),
    ],
)
def test_a_floor_is_the_lower_bound(
    floors: ModuleType, requirement: str, expected: tuple[str, str]
) -> None:
    assert floors.floor(requirement) == expected


@pytest.mark.parametrize("requirement", ["types-requests", "rich<14", "numpy==1.26.0"])
def test_a_dependency_without_a_floor_is_refused(floors: ModuleType, requirement: str) -> None:
    with pytest.raises(ValueError, match="no '>=' floor"):
        floors.floor(requirement)
