"""The environment the CLI reads its settings from (every option has an env fallback)."""

from __future__ import annotations

import os

_OTHER_SETTINGS = ("NODE_NAME", "KUBECONFIG", "KUBERNETES_SERVICE_HOST")


def is_cli_setting(name: str) -> bool:
    """Whether the CLI reads ``name``: a GPU_PROFILER_* fallback, the node or the cluster."""
    return name.startswith("GPU_PROFILER_") or name in _OTHER_SETTINGS


def environment_without_settings() -> dict[str, str]:
    """This process' environment minus the CLI's settings, for subprocesses."""
    return {name: value for name, value in os.environ.items() if not is_cli_setting(name)}
