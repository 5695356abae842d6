"""Signed local apt repositories of stand-in vendor packages (test doubles), served over HTTP.

NVIDIA's container toolkit repository and pkgs.k8s.io cannot be reached here, so the tests build
small .debs with dpkg-deb whose binaries record how they were called (see tests/nodes/standin/),
lay them out as flat repositories like the real ones (`Suites: /`), sign them with a throwaway gpg
key and serve them on the host's veth addresses. The roles use them unchanged through their
repository URL variables.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from email.utils import formatdate
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAYLOADS = Path(__file__).resolve().parent.parent / "standin"
NVIDIA_REPO = "libnvidia-container/stable/deb/amd64"
NVIDIA_KEY = "libnvidia-container/gpgkey"
KUBERNETES_MINOR = "1.31"
KUBERNETES_REPO = f"core:/stable:/v{KUBERNETES_MINOR}/deb"
KUBERNETES_KEY = f"{KUBERNETES_REPO}/Release.key"
CNI_MANIFEST = "cni/standin-cni.yaml"
KUBERNETES_VERSIONS = ("1.31.1", "1.31.2", "1.31.3")
NVIDIA_TOOLKIT_VERSIONS = ("1.17.2", "1.17.3")


@dataclass
class Package:
    """One stand-in .deb: files maps an absolute install path to (payload file, mode)."""

    name: str
    version: str
    depends: str = ""
    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    directories: tuple[str, ...] = ()

    def build(self, outdir: Path, workdir: Path) -> Path:
        tree = workdir / f"{self.name}_{self.version}"
        (tree / "DEBIAN").mkdir(parents=True)
        for directory in self.directories:
            (tree / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for install_path, (payload, mode) in self.files.items():
            target = tree / install_path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            text = (PAYLOADS / payload).read_text()
            upstream = self.version.split("-")[0]
            target.write_text(text.replace("@VERSION@", upstream).replace("@NAME@", target.name))
            target.chmod(mode)
        control = [
            f"Package: {self.name}",
            f"Version: {self.version}",
            "Architecture: amd64",
            "Maintainer: gpu-cluster-profiler tests <tests@invalid>",
            *([f"Depends: {self.depends}"] if self.depends else []),
            f"Description: stand-in {self.name} (test double)",
            " Records how it was called; not the real software.",
        ]
        conffiles = [path for path in self.files if path.startswith("/etc/")]
        (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
        if conffiles:
            (tree / "DEBIAN/conffiles").write_text("\n".join(conffiles) + "\n")
        deb = outdir / f"{self.name}_{self.version}_amd64.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)],
            check=True,
            capture_output=True,
        )
        return deb


def nvidia_packages() -> list[Package]:
    packages = []
    for upstream in NVIDIA_TOOLKIT_VERSIONS:
        version = f"{upstream}-1"
        packages += [
            Package("libnvidia-container1", version, files={}),
            Package(
                "libnvidia-container-tools",
                version,
                depends=f"libnvidia-container1 (>= {version})",
                files={"/usr/bin/nvidia-container-cli": ("record-args", 0o755)},
            ),
            Package(
                "nvidia-container-toolkit-base",
                version,
                depends="runc",
                files={
                    "/usr/bin/nvidia-container-runtime": ("nvidia-container-runtime", 0o755),
                    "/usr/bin/nvidia-ctk": ("record-args", 0o755),
                    "/etc/nvidia-container-runtime/config.toml": ("config.toml", 0o644),
                },
            ),
            Package(
                "nvidia-container-toolkit",
                version,
                depends=(
                    f"nvidia-container-toolkit-base (= {version}), "
                    f"libnvidia-container-tools (>= {version})"
                ),
                files={"/usr/bin/nvidia-container-runtime-hook": ("record-args", 0o755)},
            ),
        ]
    return packages


def kubernetes_packages() -> list[Package]:
    packages = [
        Package("cri-tools", "1.31.1-1.1", files={"/usr/bin/crictl": ("record-args", 0o755)}),
        Package(
            "kubernetes-cni", "1.5.1-1.1", files={"/opt/cni/bin/standin": ("record-args", 0o755)}
        ),
    ]
    for upstream in KUBERNETES_VERSIONS:
        version = f"{upstream}-1.1"
        packages += [
            Package("kubectl", version, files={"/usr/bin/kubectl": ("kubectl", 0o755)}),
            Package(
                "kubelet",
                version,
                depends="kubernetes-cni (>= 1.1.1)",
                # Like the real package, which ships the static pod folder.
                directories=("/etc/kubernetes/manifests",),
                files={
                    "/usr/bin/kubelet": ("kubelet", 0o755),
                    "/usr/lib/systemd/system/kubelet.service": ("kubelet.service", 0o644),
                },
            ),
            Package(
                "kubeadm",
                version,
                depends="cri-tools (>= 1.30.0), kubernetes-cni (>= 1.1.1)",
                files={
                    "/usr/bin/kubeadm": ("kubeadm", 0o755),
                    "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": (
                        "10-kubeadm.conf",
                        0o644,
                    ),
                },
            ),
        ]
    return packages


class SigningKey:
    """A throwaway gpg key in its own short-lived home directory."""

    def __init__(self) -> None:
        # gpg-agent's socket path must stay short: keep the home under /tmp.
        self.home = Path(tempfile.mkdtemp(prefix="gct-gpg-"))
        self.home.chmod(0o700)
        self._gpg(
            "--quick-generate-key",
            "gpu-cluster-profiler stand-in repository (test only)",
            "ed25519",
            "sign",
            "never",
        )

    def _gpg(self, *args: str) -> str:
        return subprocess.run(
            [
                "gpg",
                "--homedir",
                str(self.home),
                "--batch",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                *args,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def export_armored(self) -> str:
        return self._gpg("--armor", "--export")

    def sign_release(self, release: Path) -> None:
        folder = release.parent
        self._gpg("--yes", "--clearsign", "-o", str(folder / "InRelease"), str(release))
        self._gpg(
            "--yes", "--armor", "--detach-sign", "-o", str(folder / "Release.gpg"), str(release)
        )

    def close(self) -> None:
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(self.home, ignore_errors=True)


def write_flat_repository(folder: Path, key: SigningKey, label: str) -> None:
    """Write Packages(.gz) and a signed Release for the .debs in folder (a `Suites: /` repo)."""
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", "."],
        cwd=folder,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (folder / "Packages").write_text(packages)
    with gzip.open(folder / "Packages.gz", "wt") as compressed:
        compressed.write(packages)
    lines = [
        f"Origin: {label}",
        f"Label: {label}",
        "Architectures: amd64",
        f"Date: {formatdate(usegmt=True)}",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (folder / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (folder / "Release").write_text("\n".join(lines) + "\n")
    key.sign_release(folder / "Release")


def build_repositories(www: Path) -> None:
    """Build both stand-in repositories, their keys and the stand-in CNI manifest under www."""
    key = SigningKey()
    try:
        with tempfile.TemporaryDirectory(prefix="gct-debs-") as scratch:
            for folder, key_path, packages, label in (
                (NVIDIA_REPO, NVIDIA_KEY, nvidia_packages(), "stand-in libnvidia-container"),
                (KUBERNETES_REPO, KUBERNETES_KEY, kubernetes_packages(), "stand-in pkgs.k8s.io"),
            ):
                repo = www / folder
                repo.mkdir(parents=True, exist_ok=True)
                for package in packages:
                    package.build(repo, Path(scratch))
                write_flat_repository(repo, key, label)
                (www / key_path).write_text(key.export_armored())
        (www / CNI_MANIFEST).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PAYLOADS / "standin-cni.yaml", www / CNI_MANIFEST)
    finally:
        key.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


class RepositoryServer:
    """Serves www on the same port of each given host address (the veth host ends).

    stop() and start() let a test take the vendor repositories away and bring them back.
    """

    def __init__(self, www: Path, addresses: list[str]) -> None:
        self.handler = partial(_QuietHandler, directory=str(www))
        self.addresses = addresses
        self.port = 0
        self.servers: list[ThreadingHTTPServer] = []
        self.start()

    def start(self) -> None:
        for address in self.addresses:
            server = ThreadingHTTPServer((address, self.port), self.handler)
            self.port = server.server_address[1]
            self.servers.append(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def base_url(self, address: str) -> str:
        return f"http://{address}:{self.port}"

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
        self.servers = []
