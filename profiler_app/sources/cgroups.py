"""Which Kubernetes pod and container a process or cgroup belongs to.

Kubelet names pod cgroups after the pod UID, whatever the cgroup driver (systemd or cgroupfs),
the cgroup version (v1 or v2) and the runtime (containerd, CRI-O, Docker):

- v2, systemd driver: ``0::/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope``
- v2 or v1, cgroupfs driver: ``/kubepods/besteffort/pod<uid>/<id>``
- CRI-O and Docker scopes: ``crio-<id>.scope``, ``docker-<id>.scope``
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# UID with dashes (cgroupfs) or underscores (systemd); static pods use a 32-hex config hash.
_POD_SEGMENT = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$"
)
_CONTAINER_SEGMENT = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|containerd-|libpod-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
# Controllers that hold the pod hierarchy on cgroup v1, in order of preference.
_V1_CONTROLLERS = ("memory", "cpu,cpuacct", "cpuacct", "cpu", "pids")


@dataclass(frozen=True)
class ContainerRef:
    """Where a process runs: the pod UID (None outside Kubernetes) and the container id."""

    pod_uid: str | None
    container_id: str | None


@dataclass(frozen=True)
class PodCgroup:
    """The cgroup directories holding one pod's CPU and memory accounting."""

    uid: str
    version: int  # 1 or 2
    cpu_dir: Path | None
    memory_dir: Path | None


def parse_cgroup_path(path: str) -> ContainerRef | None:
    """The pod and container of one cgroup path, or None when it names neither."""
    pod_uid = None
    container_id = None
    for segment in path.strip("/").split("/"):
        pod_match = _POD_SEGMENT.search(segment)
        if pod_match:
            pod_uid = pod_match.group("uid").replace("_", "-")
            continue
        container_match = _CONTAINER_SEGMENT.match(segment)
        if container_match:
            container_id = container_match.group("id")
    if pod_uid is None and container_id is None:
        return None
    return ContainerRef(pod_uid=pod_uid, container_id=container_id)


def parse_proc_cgroup(text: str) -> ContainerRef | None:
    """The pod and container named by a ``/proc/<pid>/cgroup`` file (v1 or v2 lines).

    A line naming a pod wins over one naming only a container: on hybrid hosts the v2 line
    can be a bare ``0::/`` while the v1 controllers carry the pod path.
    """
    best: ContainerRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = parse_cgroup_path(parts[2])
        if ref is None:
            continue
        if ref.pod_uid is not None:
            return ref
        best = best or ref
    return best


def container_of_pid(pid: int, proc_root: Path = Path("/proc")) -> ContainerRef | None:
    """The pod and container of a running process; None when it is gone or not containerised."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    return parse_proc_cgroup(text)


def find_pod_cgroups(cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[PodCgroup]:
    """Every pod cgroup under ``cgroup_root``, v2 (unified) or v1 (per controller)."""
    if (cgroup_root / "cgroup.controllers").exists():
        return [
            PodCgroup(uid=uid, version=2, cpu_dir=path, memory_dir=path)
            for uid, path in _pod_dirs(cgroup_root)
        ]
    cpu_dirs = dict(_pod_dirs(_first_existing(cgroup_root, ("cpu,cpuacct", "cpuacct"))))
    memory_dirs = dict(_pod_dirs(cgroup_root / "memory"))
    return [
        PodCgroup(uid=uid, version=1, cpu_dir=cpu_dirs.get(uid), memory_dir=memory_dirs.get(uid))
        for uid in sorted(cpu_dirs.keys() | memory_dirs.keys())
    ]


def _first_existing(root: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (root / name).is_dir():
            return root / name
    return root / names[0]


def _pod_dirs(controller_root: Path) -> Iterator[tuple[str, Path]]:
    """Pod directories under the kubepods hierarchy: at most three levels below the root
    (QoS class, then pod), plus one nesting level for kubelets that run inside a container."""
    for top in _kubepods_roots(controller_root):
        stack = [(top, 0)]
        while stack:
            directory, depth = stack.pop()
            pod_match = _POD_SEGMENT.search(directory.name)
            if pod_match:
                yield pod_match.group("uid").replace("_", "-"), directory
                continue
            if depth < 2:
                stack.extend((child, depth + 1) for child in _subdirectories(directory))


def _kubepods_roots(controller_root: Path) -> Iterator[Path]:
    for candidate in ("kubepods.slice", "kubepods", "kubelet.slice/kubelet-kubepods.slice"):
        if (controller_root / candidate).is_dir():
            yield controller_root / candidate


def _subdirectories(directory: Path) -> list[Path]:
    try:
        return [child for child in directory.iterdir() if child.is_dir()]
    except OSError:
        return []
