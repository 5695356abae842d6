"""Key inventories of Helm charts' values.yaml, to catch values that a chart would silently ignore.

Helm cannot run here, so a typo in a values key (``serviceMonitor.honourLabels``) would go
unnoticed until a real install. An inventory lists every key path of a chart's values.yaml at the
pinned version, with its kind: ``map`` (a mapping with documented keys), ``open`` (an empty mapping
or null: free-form) or ``leaf`` (a scalar or a list). Regenerate one from the chart's values.yaml:

    python -m tests.infra.chart_keys VALUES.yaml "chart version, source URL" [SECTION ...] > FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

# Mappings whose keys are the user's own (label names, selector terms), whatever the default.
FREE_FORM = frozenset(
    {"nodeSelector", "labels", "annotations", "podLabels", "podAnnotations", "additionalLabels"}
)


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "map" if value else "open"
    return "open" if value is None else "leaf"


def key_paths(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[str, str]:
    """``"a.b.c" -> kind`` for every key of a values document."""
    paths: dict[str, str] = {}
    for key, value in values.items():
        path = (*prefix, str(key))
        paths[".".join(path)] = _kind(value)
        if isinstance(value, dict) and key not in FREE_FORM:
            paths.update(key_paths(value, path))
    return paths


def unknown_keys(ours: dict[str, Any], inventory: dict[str, str], prefix: str = "") -> list[str]:
    """Key paths in ``ours`` that the chart does not have."""
    unknown = []
    for key, value in ours.items():
        path = f"{prefix}.{key}" if prefix else key
        kind = inventory.get(path)
        if kind is None:
            unknown.append(path)
        elif isinstance(value, dict) and kind == "map" and key not in FREE_FORM:
            unknown.extend(unknown_keys(value, inventory, path))
        elif isinstance(value, dict) and kind == "leaf":
            unknown.append(f"{path} (a mapping where the chart has a scalar or list)")
    return unknown


def load_inventory(path: Path) -> dict[str, str]:
    document = json.loads(path.read_text())
    paths: dict[str, str] = document["paths"]
    return paths


def main(argv: list[str]) -> None:
    values_file, source, *sections = argv
    values = yaml.safe_load(Path(values_file).read_text())
    if sections:
        values = {key: values[key] for key in sections}
    document = {"source": source, "sections": sections or "all", "paths": key_paths(values)}
    print(json.dumps(document, indent=0, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
