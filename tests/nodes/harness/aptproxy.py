"""Debian's apt-cacher-ng on the host, serving the nodes Debian's archive and nothing else.

Its service does not start here (PID 1 is not systemd), so the harness runs it in the foreground
with its own configuration directory; the package cache lives in the stable CACHE_DIR so later
runs (and CI on the same machine) are warm.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

from tests.nodes.harness.machine import enter_cgroup_command, harness_cgroup, remove_cgroup
from tests.nodes.harness.rootfs import CACHE_DIR

PORT = 3142
# Only Debian's archive: ForceManaged refuses every host not named by a Remap- line.
ALLOWED_REPOSITORIES = (
    "Remap-debrep: deb.debian.org/debian ; http://deb.debian.org/debian",
    "Remap-secdeb: deb.debian.org/debian-security security.debian.org/debian-security"
    " ; http://deb.debian.org/debian-security",
)


class AptProxy:
    """A running apt-cacher-ng bound to the given host addresses."""

    def __init__(self, workdir: Path, addresses: list[str], port: int = PORT) -> None:
        self.workdir = workdir
        self.addresses = addresses
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, address: str) -> str:
        return f"http://{address}:{self.port}"

    def start(self, timeout: float = 20) -> None:
        conf = self.workdir / "conf"
        logs = self.workdir / "log"
        conf.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        cache = CACHE_DIR / "apt-cacher-ng"
        cache.mkdir(parents=True, exist_ok=True)
        (conf / "acng.conf").write_text(
            "\n".join(
                [
                    f"CacheDir: {cache}",
                    f"LogDir: {logs}",
                    "SupportDir: /usr/lib/apt-cacher-ng",
                    f"Port: {self.port}",
                    f"BindAddress: {' '.join(self.addresses)}",
                    f"SocketPath: {self.workdir / 'socket'}",
                    f"PidFile: {self.workdir / 'pid'}",
                    "ForeGround: 1",
                    "ForceManaged: 1",
                    "ExThreshold: 30",
                    "UnbufferLogs: 1",
                    *ALLOWED_REPOSITORIES,
                    "",
                ]
            )
        )
        output = (logs / "stdout.log").open("wb")
        # In its own cgroup so that a later run can reap it if this one dies without teardown.
        self.cgroup = harness_cgroup("aptproxy")
        self.process = subprocess.Popen(
            ["sh", "-c", f"{enter_cgroup_command(self.cgroup)}; exec apt-cacher-ng -c {conf}"],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"apt-cacher-ng exited: {self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.addresses[0], self.port), 1),
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"apt-cacher-ng did not listen on {self.addresses[0]}:{self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.process is not None:
            remove_cgroup(self.cgroup)

    def log_tail(self) -> str:
        path = self.workdir / "log" / "stdout.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def __enter__(self) -> AptProxy:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
