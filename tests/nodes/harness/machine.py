"""One Debian node booted by systemd-nspawn: systemd is PID 1, SSH reachable over a veth pair.

The nspawn flags and the per-node cgroup suit a test machine whose
PID 1 is not systemd (no machined), so each node is started from its own cgroup and driven with
nsenter or SSH rather than machinectl.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.nodes.harness import rootfs

CGROUP_HIERARCHIES = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
NSPAWN_FLAGS = (
    "--register=no",
    "--keep-unit",
    "--network-veth",
    "--console=passive",
    # What Docker inside the node needs to run containers (see the notes).
    "--system-call-filter=@keyring",
    "--system-call-filter=bpf",
)
DPKG_TEST_SETTINGS = """force-unsafe-io
path-exclude=/usr/share/doc/*
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
"""
# Modules Kubernetes nodes need, as modules.builtin names them, and how to see them built in.
BUILTIN_PROBES = {
    "kernel/fs/overlayfs/overlay.ko": ("/sys/module/overlay",),
    "kernel/net/bridge/br_netfilter.ko": ("/proc/sys/net/bridge/bridge-nf-call-iptables",),
    "kernel/net/bridge/bridge.ko": ("/sys/module/bridge",),
}


CGROUP_PREFIX = "gpu-cluster-tests-"
# The systems a node can say it is. Ubuntu nodes are the Debian 12 userland with Ubuntu's
# os-release (Ubuntu's archive is unreachable here): Ansible then takes every Ubuntu path of the
# roles, against the stand-in vendor repositories, while Debian's archive serves the rest.
UBUNTU_OS_RELEASE = {
    "ubuntu2204": ("22.04", "22.04.5 LTS (Jammy Jellyfish)", "jammy"),
    "ubuntu2404": ("24.04", "24.04.3 LTS (Noble Numbat)", "noble"),
}
SYSTEMS = ("debian12", *UBUNTU_OS_RELEASE)


def ubuntu_os_release(system: str) -> str:
    version_id, version, codename = UBUNTU_OS_RELEASE[system]
    return (
        f'PRETTY_NAME="Ubuntu {version.split(" (")[0]}"\nNAME="Ubuntu"\nVERSION_ID="{version_id}"\n'
        f'VERSION="{version}"\nVERSION_CODENAME={codename}\nID=ubuntu\nID_LIKE=debian\n'
        f"UBUNTU_CODENAME={codename}\n"
    )


def harness_cgroup(what: str) -> str:
    """The cgroup name of something this process starts, so a later run can reap it."""
    return f"{CGROUP_PREFIX}{what}-{os.getpid()}"


def enter_cgroup_command(name: str) -> str:
    """Shell commands that create cgroup `name` and move the running shell into it."""
    for hierarchy in CGROUP_HIERARCHIES:
        (hierarchy / name).mkdir(exist_ok=True)
    return "; ".join(
        f"echo $$ > {hierarchy / name / 'cgroup.procs'}" for hierarchy in CGROUP_HIERARCHIES
    )


def remove_cgroup(name: str) -> None:
    for hierarchy in CGROUP_HIERARCHIES:
        _remove_cgroup(hierarchy / name)


class NodeError(RuntimeError):
    """A node failed to boot or to answer."""


def free_index(start: int = 1) -> int:
    """The first N whose veth ve-gctN and subnet 10.200.N.0/24 are unused on this host."""
    addresses = subprocess.run(
        ["ip", "-o", "addr"], capture_output=True, text=True, check=True
    ).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    for index in range(start, 250):
        if f"ve-gct{index}" not in links and f" 10.200.{index}." not in addresses:
            return index
    raise NodeError("no free 10.200.N.0/24 subnet left for a test node")


@dataclass
class Node:
    """A booted node. `name` is its hostname and Ansible inventory name."""

    name: str
    index: int
    workdir: Path
    ssh_key: Path
    system: str = "debian12"
    process: subprocess.Popen[bytes] | None = None
    leader: int | None = None
    host_public_keys: list[str] = field(default_factory=list)

    @property
    def machine(self) -> str:
        return f"gct{self.index}"

    @property
    def veth(self) -> str:
        return f"ve-{self.machine}"

    @property
    def host_address(self) -> str:
        return f"10.200.{self.index}.1"

    @property
    def address(self) -> str:
        return f"10.200.{self.index}.2"

    @property
    def root(self) -> Path:
        return self.workdir / "root"

    @property
    def cgroup(self) -> str:
        return harness_cgroup(self.machine)

    # -- lifecycle -----------------------------------------------------------------------------

    def prepare(self, tarball: Path) -> None:
        """Unpack the root filesystem and configure hostname, network and SSH before boot."""
        rootfs.unpack(tarball, self.root)
        etc = self.root / "etc"
        if self.system in UBUNTU_OS_RELEASE:
            # /etc/os-release links to it, as on Ubuntu.
            (self.root / "usr/lib/os-release").write_text(ubuntu_os_release(self.system))
        (etc / "hostname").write_text(f"{self.name}\n")
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.address} {self.name}\n")
        (etc / "machine-id").write_text("")
        network = etc / "systemd/network"
        network.mkdir(parents=True, exist_ok=True)
        (network / "80-container-host0.network").write_text(
            f"[Match]\nName=host0\n\n[Network]\nAddress={self.address}/24\nLinkLocalAddressing=no\n"
        )
        wants = etc / "systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            (wants / "systemd-networkd.service").symlink_to(
                "/lib/systemd/system/systemd-networkd.service"
            )
        ssh_dir = self.root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        public_key = self.ssh_key.with_suffix(".pub").read_text()
        (ssh_dir / "authorized_keys").write_text(public_key)
        (ssh_dir / "authorized_keys").chmod(0o600)
        subprocess.run(["ssh-keygen", "-A", "-f", str(self.root)], check=True, capture_output=True)
        self._describe_builtin_modules()
        # Like minimal cloud images: no fsync per file, no docs or man pages (faster dpkg).
        (etc / "dpkg/dpkg.cfg.d/gpu-cluster-tests").write_text(DPKG_TEST_SETTINGS)
        self.host_public_keys = [
            " ".join(path.read_text().split()[:2])
            for path in sorted((etc / "ssh").glob("ssh_host_*_key.pub"))
        ]

    def _describe_builtin_modules(self) -> None:
        """Tell kmod inside the node which modules the shared host kernel has built in.

        Some CI kernels (this one) have no loadable modules: no /lib/modules, no /proc/modules.
        The node then gets the modules.builtin file such a kernel would ship, listing only what
        is really built in, so kmod (modprobe, systemd-modules-load) knows they are there.
        """
        release = os.uname().release
        if Path(f"/lib/modules/{release}").exists():
            return
        builtin = [
            path
            for path, present in BUILTIN_PROBES.items()
            if any(Path(probe).exists() for probe in present)
        ]
        folder = self.root / "lib/modules" / release
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "modules.builtin").write_text("".join(f"{path}\n" for path in builtin))

    def boot(self, timeout: float = 60) -> None:
        """Start systemd-nspawn detached from its own cgroup and wait until SSH answers."""
        enter_cgroups = enter_cgroup_command(self.cgroup)
        binds = []
        if (self.workdir / "proc-modules").exists():
            binds.append(f"--bind-ro={self.workdir / 'proc-modules'}:/proc/modules")
        nspawn = " ".join(
            [
                "exec systemd-nspawn -b",
                f"-D {self.root}",
                f"-M {self.machine}",
                *NSPAWN_FLAGS,
                *binds,
            ]
        )
        log = (self.workdir / "console.log").open("wb")
        self.process = subprocess.Popen(
            ["sh", "-c", f"{enter_cgroups}; {nspawn}"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        self.leader = self._wait_for_leader(deadline)
        self._configure_host_veth(deadline)
        self._wait_for_systemd(deadline)
        self._wait_for_ssh(deadline)

    def poweroff(self, timeout: float = 30) -> None:
        """Power the node off (SIGKILL if it hangs), then remove its cgroups. Safe to call twice."""
        if self.process is not None and self.process.poll() is None:
            if self.leader is not None:
                subprocess.run(
                    ["nsenter", "-t", str(self.leader), "-a", "systemctl", "poweroff"],
                    capture_output=True,
                    check=False,
                    timeout=30,
                )
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        remove_cgroup(self.cgroup)

    def remove(self) -> None:
        """Delete the node's files (after poweroff)."""
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- access --------------------------------------------------------------------------------

    def run(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command inside the node (all its namespaces) through nsenter."""
        if self.leader is None:
            raise NodeError(f"{self.name} is not booted")
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "sh", "-c", command],
            capture_output=True,
            text=True,
            check=check,
            timeout=300,
        )

    def read(self, path: str) -> str:
        return (self.root / path.lstrip("/")).read_text()

    # -- boot steps ----------------------------------------------------------------------------

    def _wait_for_leader(self, deadline: float) -> int:
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NodeError(f"{self.name}: systemd-nspawn exited: {self._console_tail()}")
            children = subprocess.run(
                ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
            if children:
                return int(children[0])
            time.sleep(0.1)
        raise NodeError(f"{self.name}: systemd did not start: {self._console_tail()}")

    def _configure_host_veth(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if Path(f"/sys/class/net/{self.veth}").exists():
                subprocess.run(
                    ["ip", "addr", "replace", f"{self.host_address}/24", "dev", self.veth],
                    check=True,
                )
                subprocess.run(["ip", "link", "set", self.veth, "up"], check=True)
                return
            time.sleep(0.1)
        raise NodeError(f"{self.name}: {self.veth} never appeared")

    def _wait_for_systemd(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl is-system-running", check=False).stdout.strip()
            if state in {"running", "degraded"}:
                return
            time.sleep(0.3)
        raise NodeError(f"{self.name}: systemd state {state!r} after boot timeout")

    def _wait_for_ssh(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection((self.address, 22), 1):
                return
            time.sleep(0.2)
        raise NodeError(f"{self.name}: SSH on {self.address}:22 never answered")

    def _console_tail(self) -> str:
        log = self.workdir / "console.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""


def reap_stale_nodes() -> list[str]:
    """Kill the nodes of harness runs that died without tearing down (SIGKILL, power loss).

    Only cgroups this harness created (gpu-cluster-tests-<what>-PID: nodes, the apt proxy)
    whose creating process PID is gone are touched. Returns the cgroup names reaped.
    """
    reaped = []
    for hierarchy in CGROUP_HIERARCHIES:
        for group in hierarchy.glob(f"{CGROUP_PREFIX}*-*"):
            owner = group.name.rsplit("-", 1)[1]
            if not owner.isdigit() or Path(f"/proc/{owner}").exists():
                continue
            for procs in group.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.5)
            _remove_cgroup(group)
            reaped.append(group.name)
    return reaped


def _remove_cgroup(path: Path) -> None:
    """Remove a cgroup directory tree bottom-up (cgroupfs only allows rmdir of empty groups)."""
    if not path.exists():
        return
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
