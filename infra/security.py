"""Security settings shared by the pods this package creates itself (restricted Pod Security)."""

from __future__ import annotations

import pulumi_kubernetes as k8s


def non_root_pod_security(user: int) -> k8s.core.v1.PodSecurityContextArgs:
    """A pod running as ``user`` (user, group, volume group) under the runtime's seccomp profile."""
    return k8s.core.v1.PodSecurityContextArgs(
        run_as_non_root=True,
        run_as_user=user,
        run_as_group=user,
        fs_group=user,
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    )
