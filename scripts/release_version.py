#!/usr/bin/env python3
"""Prints ``version=X`` for the release tag ``vX`` (a line for $GITHUB_OUTPUT), after checking
that X is pyproject.toml's project.version; otherwise one error line and exit status 1.

Used by .github/workflows/image.yml: the image it pushes is tagged X, and the stacks deploy the
image of the project's version (infra/versions.py).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: release_version.py TAG   (a tag such as v0.1.0)", file=sys.stderr)
        return 2
    tag = argv[1]
    project = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    if not tag.startswith("v") or tag[1:] != project:
        print(
            f"error: tag {tag!r} does not name version {project} of pyproject.toml: tag "
            f"v{project}, or change project.version first",
            file=sys.stderr,
        )
        return 1
    print(f"version={project}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
