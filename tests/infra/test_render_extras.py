"""``python -m infra.render`` without an optional dependency: one line naming the extra, exit 2.

The dependency is hidden from a real run of the command by a ``sitecustomize`` module that
refuses its import, as an environment without that extra installed would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HIDE = """
import sys

class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Hidden())
"""


@pytest.mark.parametrize(
    ("module", "stack", "extra"),
    [
        ("ansible", "stacks/kubeadm", "render,ansible"),
        # The EKS render reaches for helm_python only once its charts are there.
        pytest.param("helm_python", "stacks/eks", "render", marks=pytest.mark.charts),
    ],
)
def test_a_missing_extra_is_one_line(tmp_path: Path, module: str, stack: str, extra: str) -> None:
    (tmp_path / "sitecustomize.py").write_text(HIDE.format(module=module))
    completed = subprocess.run(
        [sys.executable, "-m", "infra.render", stack, "--check"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr == f"render: error: {module} is missing: pip install -e '.[{extra}]'\n"
    assert completed.stdout == ""
