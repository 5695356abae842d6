"""Pod and container attribution from cgroup paths, with samples taken from real nodes."""

import os
from pathlib import Path

import pytest

from profiler_app.sources.cgroups import (
    ContainerRef,
    container_of_pid,
    find_pod_cgroups,
    parse_cgroup_path,
    parse_proc_cgroup,
)

UID = "0b6a4e0c-5d2f-4c6e-9a3e-2f1b7c8d9e01"
UID_SYSTEMD = UID.replace("-", "_")
CID = "4c1f0e8a3b2d5f6e7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"
STATIC_POD_HASH = "c9c1c6d0a1e3e7c5d0b6e39dffc4f7a8"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, systemd driver, containerd (kubeadm on Debian 12 / Ubuntu 22.04+).
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/"
            f"cri-containerd-{CID}.scope\n",
            ContainerRef(UID, CID),
        ),
        # cgroup v2, systemd driver, guaranteed QoS (no QoS level in the path), CRI-O.
        (
            f"0::/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/crio-{CID}.scope\n",
            ContainerRef(UID, CID),
        ),
        # cgroup v2, cgroupfs driver (k3s, older kubeadm).
        (f"0::/kubepods/besteffort/pod{UID}/{CID}\n", ContainerRef(UID, CID)),
        # cgroup v1, systemd driver, Docker via cri-dockerd: the pod path is on every controller.
        (
            "12:pids:/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_SYSTEMD}.slice/docker-{CID}.scope\n"
            "11:memory:/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_SYSTEMD}.slice/docker-{CID}.scope\n"
            "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_SYSTEMD}.slice/docker-{CID}.scope\n"
            "0::/\n",
            ContainerRef(UID, CID),
        ),
        # cgroup v1, cgroupfs driver, guaranteed pod.
        (
            f"4:memory:/kubepods/pod{UID}/{CID}\n3:cpu,cpuacct:/kubepods/pod{UID}/{CID}\n",
            ContainerRef(UID, CID),
        ),
        # Kubelet inside a container (kind): the pod hierarchy is nested.
        (
            "0::/system.slice/docker-1111111111111111111111111111111111111111111111111111111111111111"
            ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            ContainerRef(UID, CID),
        ),
        # A static (mirror) pod: the UID is the manifest's hash.
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_POD_HASH}"
            f".slice/cri-containerd-{CID}.scope\n",
            ContainerRef(STATIC_POD_HASH, CID),
        ),
        # The pod's sandbox-level cgroup (no container yet).
        (f"0::/kubepods/burstable/pod{UID}\n", ContainerRef(UID, None)),
        # Plain Docker, no Kubernetes: container only.
        (f"0::/system.slice/docker-{CID}.scope\n", ContainerRef(None, CID)),
        (f"4:memory:/docker/{CID}\n0::/\n", ContainerRef(None, CID)),
        # Host processes.
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/init.scope\n", None),
        ("0::/\n", None),
        ("", None),
    ],
)
def test_parse_proc_cgroup(text: str, expected: ContainerRef | None) -> None:
    assert parse_proc_cgroup(text) == expected


def test_conmon_scope_is_not_a_container() -> None:
    ref = parse_cgroup_path(
        f"/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/crio-conmon-{CID}.scope"
    )
    assert ref == ContainerRef(UID, None)


def test_pod_line_wins_over_container_only_line() -> None:
    text = f"5:devices:/docker/{CID}\n4:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
    assert parse_proc_cgroup(text) == ContainerRef(UID, CID)


def test_container_of_pid_reads_proc(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    assert container_of_pid(4242, proc_root=tmp_path) == ContainerRef(UID, CID)
    assert container_of_pid(4243, proc_root=tmp_path) is None


def test_container_of_pid_on_this_machine_does_not_fail() -> None:
    """The real /proc of the test process: this host is not a Kubernetes node."""
    ref = container_of_pid(os.getpid())
    assert ref is None or ref.pod_uid is None


def _make_dirs(root: Path, *paths: str) -> None:
    for path in paths:
        (root / path).mkdir(parents=True)


def test_find_pod_cgroups_v2_systemd(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    burstable = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice"
    guaranteed = f"kubepods.slice/kubepods-pod{STATIC_POD_HASH}.slice"
    _make_dirs(tmp_path, f"{burstable}/cri-containerd-{CID}.scope", guaranteed, "system.slice")
    found = {pod.uid: pod for pod in find_pod_cgroups(tmp_path)}
    assert set(found) == {UID, STATIC_POD_HASH}
    assert found[UID].version == 2
    assert found[UID].cpu_dir == tmp_path / burstable
    assert found[UID].memory_dir == tmp_path / burstable


def test_find_pod_cgroups_v1_cgroupfs(tmp_path: Path) -> None:
    _make_dirs(
        tmp_path,
        f"cpu,cpuacct/kubepods/besteffort/pod{UID}/{CID}",
        f"memory/kubepods/besteffort/pod{UID}/{CID}",
        f"memory/kubepods/pod{STATIC_POD_HASH}",
    )
    found = {pod.uid: pod for pod in find_pod_cgroups(tmp_path)}
    assert found[UID].version == 1
    assert found[UID].cpu_dir == tmp_path / f"cpu,cpuacct/kubepods/besteffort/pod{UID}"
    assert found[UID].memory_dir == tmp_path / f"memory/kubepods/besteffort/pod{UID}"
    assert found[STATIC_POD_HASH].cpu_dir is None


def test_find_pod_cgroups_without_kubernetes(tmp_path: Path) -> None:
    _make_dirs(tmp_path, "memory/user.slice", "cpu,cpuacct/system.slice")
    assert find_pod_cgroups(tmp_path) == []
