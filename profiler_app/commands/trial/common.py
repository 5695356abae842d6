"""What the ``trial`` verbs' handlers share: checked durations, manifests read from files, and
the connection to the API server (the Kubernetes client loaded only when one is needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from profiler_app.core.durations import parse_duration
from profiler_app.core.errors import UserError
from profiler_app.trial.manifests import API_VERSIONS

if TYPE_CHECKING:
    from profiler_app.trial.cluster import TrialCluster


def duration(text: str, flag: str) -> float:
    try:
        return parse_duration(text)
    except UserError as error:
        raise UserError(f"{flag}: {error}") from None


def grace(text: str) -> int:
    seconds = duration(text, "--grace-period")
    if seconds < 0:
        raise UserError(f"--grace-period {text!r} must not be negative")
    return round(seconds)


def read_document(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise UserError(f"{path} is not YAML or JSON: {' '.join(str(error).split())}") from None
    workloads = [d for d in documents if isinstance(d, dict) and d.get("kind") in API_VERSIONS]
    if len(documents) == 1:
        return documents[0]
    if len(workloads) != 1:
        raise UserError(
            f"{path} holds {len(documents)} documents; give it one Job, PyTorchJob or Pod"
        )
    return workloads[0]


def connect(kubeconfig: str | None) -> TrialCluster:
    from profiler_app.core import kube  # noqa: PLC0415
    from profiler_app.trial.cluster import TrialCluster  # noqa: PLC0415

    connection = kube.connect(kubeconfig)
    if connection is None:
        raise UserError(
            "no Kubernetes API: give --kubeconfig (or set KUBECONFIG), or run in a "
            "pod with a service account"
        )
    return TrialCluster(connection)


def api_errors() -> tuple[type[Exception], ...]:
    """What a call to the API server raises (loaded with the client: ``plan --from --nodes``
    never needs it)."""
    from profiler_app.trial.cluster import ApiError, UnavailableError  # noqa: PLC0415
    from profiler_app.trial.guards import GuardError  # noqa: PLC0415

    return (ApiError, UnavailableError, GuardError)
