"""Run ``gpu-profiler unprotect`` for GpuProfiler when ``pulumi destroy`` removes it.

Pulumi's ``command.local.Command`` runs ``python -m infra.unprotect_run`` as its delete step,
on the machine running Pulumi, once the DaemonSet and its pods are gone. Its inputs come in the
environment (the kubeconfig is a secret in Pulumi's state): the kubeconfig reaches the command
only as a file readable by the current user alone, in a private temporary directory removed
afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from profiler_app.cli import main as gpu_profiler
from profiler_app.core.annotations import DEFAULT_DOMAIN

ENV_KUBECONFIG = "GPU_CLUSTER_KUBECONFIG"  # the kubeconfig's content, not a path
ENV_ANNOTATION_DOMAIN = "GPU_PROFILER_ANNOTATION_DOMAIN"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``python -m infra.unprotect_run`` (takes no arguments): the exit status
    of ``gpu-profiler unprotect``, 2 when the environment lacks the kubeconfig."""
    del argv
    environ = os.environ if environ is None else environ
    kubeconfig = environ.get(ENV_KUBECONFIG, "")
    if not kubeconfig.strip():
        print(f"error: {ENV_KUBECONFIG} must hold the cluster's kubeconfig", file=sys.stderr)
        return 2
    domain = environ.get(ENV_ANNOTATION_DOMAIN) or DEFAULT_DOMAIN
    with tempfile.TemporaryDirectory(prefix="gpu-profiler-unprotect-") as folder:
        path = Path(folder) / "kubeconfig"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(kubeconfig)
        print("removing the do-not-disrupt annotations gpu-profiler set", file=sys.stderr)
        return gpu_profiler(["unprotect", "--kubeconfig", str(path), "--annotation-domain", domain])


if __name__ == "__main__":
    sys.exit(main())
