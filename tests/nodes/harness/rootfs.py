"""A Debian 12 root filesystem made by debootstrap, cached as a zstd tarball between runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE_DIR = Path(os.environ.get("GPU_CLUSTER_TESTS_CACHE", "/var/cache/gpu-cluster-tests"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What a node needs to boot with systemd as PID 1 and be driven by Ansible over SSH.
INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "iproute2",
    "ca-certificates",
    "gpg",
)


def tarball_path() -> Path:
    """The cache file name changes whenever what goes into the root filesystem changes."""
    recipe = f"{SUITE} {MIRROR} minbase {','.join(INCLUDE)}"
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    return CACHE_DIR / f"debian-{SUITE}-{digest}.tar.zst"


def ensure_tarball() -> Path:
    """Return the cached root filesystem tarball, running debootstrap (about 2 min) if absent."""
    target = tarball_path()
    if target.exists():
        return target
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="debootstrap-") as work:
        root = Path(work) / "root"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(INCLUDE)}",
                SUITE,
                str(root),
                MIRROR,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # Host keys are generated per node at unpack time, not baked into the shared image.
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        partial = target.with_suffix(".partial")
        subprocess.run(
            f"tar --numeric-owner -C {root} -cf - . | zstd -q -3 -T0 -o {partial} -f",
            shell=True,
            check=True,
        )
        partial.rename(target)
    return target


def unpack(tarball: Path, root: Path) -> None:
    """Unpack the cached tarball into an empty directory."""
    root.mkdir(parents=True)
    subprocess.run(
        ["tar", "--numeric-owner", "--zstd", "-xpf", str(tarball), "-C", str(root)],
        check=True,
    )
