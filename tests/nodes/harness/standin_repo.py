"""Signed local apt repositories of stand-in vendor packages (test doubles), served over HTTP.

NVIDIA's container toolkit repository, NVIDIA's CUDA repositories (ubuntu2204, ubuntu2404),
Docker CE's Ubuntu repository and pkgs.k8s.io cannot be reached here, so the tests build small
.debs with dpkg-deb under the real package names, whose binaries record how they were called (see
tests/nodes/standin/), lay them out like the real repositories (flat `Suites: /` for NVIDIA and
Kubernetes; `dists/<codename>/stable` plus `pool/` for Docker), sign them with a throwaway gpg key
and serve them on the host's veth addresses. The roles use them unchanged through their repository
URL variables. On the Ubuntu test nodes the daemons are real all the same: `docker-ce` is Debian's
real `docker.io` .deb (fetched through the apt proxy) repackaged under Docker CE's name and version,
and the stand-in `containerd.io` depends on Debian's real `containerd`.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import shutil
import subprocess
import tempfile
import threading
import urllib.request
from dataclasses import dataclass, field
from email.utils import formatdate
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAYLOADS = Path(__file__).resolve().parent.parent / "standin"
NVIDIA_REPO = "libnvidia-container/stable/deb/amd64"
NVIDIA_KEY = "libnvidia-container/gpgkey"
KUBERNETES_MINOR = "1.35"


def kubernetes_repo(minor: str) -> str:
    """pkgs.k8s.io's path of one minor version's repository (each minor has its own)."""
    return f"core:/stable:/v{minor}/deb"


KUBERNETES_REPO = kubernetes_repo(KUBERNETES_MINOR)
KUBERNETES_KEY = f"{KUBERNETES_REPO}/Release.key"
CNI_MANIFEST = "cni/standin-cni.yaml"
KUBERNETES_VERSIONS = ("1.35.8", "1.35.9", "1.35.10")
# The minor before, in its own repository: what a cluster is upgraded from (test_upgrade.py).
KUBERNETES_PREVIOUS_MINOR = "1.34"
KUBERNETES_PREVIOUS_VERSIONS = ("1.34.3",)
NVIDIA_TOOLKIT_VERSIONS = ("1.17.3", "1.18.0", "1.20.0")
# NVIDIA's CUDA repositories (flat, one per Ubuntu release) and the driver branches they offer.
CUDA_DISTRIBUTIONS = ("ubuntu2204", "ubuntu2404")
CUDA_KEY_NAME = "3bf863cc.pub"
# Two releases of 580: a host whose driver predates the newer one must get Fabric Manager at its
# driver's version, not the newest (test_fabric.py).
DRIVER_VERSIONS = {"570": ("570.195.03",), "580": ("580.95.05", "580.105.08")}
# NVIDIA's NVLink Subnet Manager: one package for every branch, versioned by date (the CUDA
# redistributable's version: siderolabs/extensions@main:nvidia-gpu/vars.yaml,
# NVIDIA_NVLSM_LTS_VERSION; the Debian revision -1 is NVIDIA's usual one, not seen).
NVLSM_VERSION = "2025.06.5-1"
# NVIDIA's MIG manager package, published as a GitHub release asset.
MIG_MANAGER_VERSION = "0.14.5"
# Docker CE's repository for Ubuntu: dists/<codename>/stable.
DOCKER_REPO = "linux/ubuntu"
DOCKER_KEY = f"{DOCKER_REPO}/gpg"
DOCKER_CODENAMES = {"jammy": "22.04", "noble": "24.04"}
# Where Debian's docker.io comes from (through the apt proxy), to be repackaged as docker-ce.
DEBIAN_MAIN_INDEX = "http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/Packages.xz"
DEBIAN_POOL = "http://deb.debian.org/debian/"


def cuda_repo(distribution: str) -> str:
    return f"compute/cuda/repos/{distribution}/x86_64"


@dataclass
class Package:
    """One stand-in .deb: files maps an absolute install path to (payload file, mode)."""

    name: str
    version: str
    depends: str = ""
    files: dict[str, tuple[str, int]] = field(default_factory=dict)
    conflicts: str = ""
    provides: str = ""
    directories: tuple[str, ...] = ()
    # Maintainer scripts: DEBIAN name ("postinst") -> payload file.
    scripts: dict[str, str] = field(default_factory=dict)

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
            *([f"Conflicts: {self.conflicts}"] if self.conflicts else []),
            *([f"Provides: {self.provides}"] if self.provides else []),
            f"Description: stand-in {self.name} (test double)",
            " Records how it was called; not the real software.",
        ]
        conffiles = [path for path in self.files if path.startswith("/etc/")]
        (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for script, payload in self.scripts.items():
            (tree / "DEBIAN" / script).write_text((PAYLOADS / payload).read_text())
            (tree / "DEBIAN" / script).chmod(0o755)
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
        base_files = {
            "/usr/bin/nvidia-container-runtime": ("nvidia-container-runtime", 0o755),
            "/usr/bin/nvidia-ctk": ("record-args", 0o755),
            "/etc/nvidia-container-runtime/config.toml": ("config.toml", 0o644),
        }
        if upstream >= "1.18":
            # 1.18 ships nvidia-cdi-refresh, which keeps the CDI specification current, where
            # NVIDIA/nvidia-container-toolkit's
            # packaging/debian/nvidia-container-toolkit-base.install puts it:
            # /etc/systemd/system/ at v1.18.0 to v1.19.1, /lib/systemd/system/ from v1.20.0.
            units = "/etc/systemd/system" if upstream < "1.20" else "/lib/systemd/system"
            base_files |= {
                f"{units}/nvidia-cdi-refresh.service": ("nvidia-cdi-refresh.service", 0o644),
                f"{units}/nvidia-cdi-refresh.path": ("nvidia-cdi-refresh.path", 0o644),
                "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env": (
                    "nvidia-cdi-refresh.env",
                    0o644,
                ),
            }
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
                depends="runc, python3",
                files=base_files,
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


def cuda_packages() -> list[Package]:
    """The driver packages of NVIDIA's CUDA repository per branch: open and proprietary flavours,
    their kernel-common packages, Fabric Manager coupled to them, and nvlsm.

    Control fields as Ubuntu's packages have them (packages.ubuntu.com, noble/questing:
    nvidia-graphics-drivers-580, fabric-manager-580): nvidia-kernel-common-<branch> provides
    nvidia-kernel-common-<branch>-<upstream> (its -server twin -server-<upstream>), and
    nvidia-fabricmanager-<branch> depends on nvidia-kernel-common-<branch>-server-<upstream>, so apt
    installs Fabric Manager only together with the kernel-common files of its own driver release.
    Fabric Manager's version is <upstream>-1 as in NVIDIA's CUDA repository
    (NVIDIA/gpu-driver-container@06a208c:ubuntu22.04/install.sh installs it as
    nvidia-fabricmanager...=${DRIVER_VERSION}-1). The headless sets reach kernel-common through
    nvidia-headless-no-dkms-<branch> in the real repository; here they depend on it directly.
    nvlsm: /opt/nvidia/nvlsm/sbin/nvlsm and /usr/share/nvidia/nvlsm/nvlsm.conf, the paths of
    NVIDIA's nvlsm archive
    (siderolabs/extensions@main:nvidia-gpu/nvidia-fabricmanager/lts/pkg.yaml).
    """
    packages = [
        Package(
            "nvlsm",
            NVLSM_VERSION,
            files={
                "/opt/nvidia/nvlsm/sbin/nvlsm": ("nvlsm", 0o755),
                "/usr/share/nvidia/nvlsm/nvlsm.conf": ("nvlsm.conf", 0o644),
            },
        )
    ]
    for branch, upstreams in DRIVER_VERSIONS.items():
        for upstream in upstreams:
            packages += _driver_release(branch, upstream)
    return packages


def _driver_release(branch: str, upstream: str) -> list[Package]:
    version = f"{upstream}-0ubuntu1"
    common = f"nvidia-kernel-common-{branch} (= {version})"
    smi = {"/usr/bin/nvidia-smi": ("nvidia-smi", 0o755)}
    return [
        Package(
            f"nvidia-kernel-common-{branch}",
            version,
            provides=f"nvidia-kernel-common-{branch}-{upstream}",
        ),
        Package(
            f"nvidia-kernel-common-{branch}-server",
            version,
            provides=f"nvidia-kernel-common-{branch}-server-{upstream}",
        ),
        # Like the real ones: nvidia-smi comes with nvidia-utils, which the full drivers depend
        # on and which the headless (compute-only) sets leave to be named next to them.
        Package(f"nvidia-utils-{branch}", version, files=smi),
        Package(
            f"nvidia-driver-{branch}-open",
            version,
            depends=f"nvidia-utils-{branch} (= {version}), {common}",
            conflicts=f"nvidia-driver-{branch}",
        ),
        Package(
            f"nvidia-driver-{branch}",
            version,
            depends=f"nvidia-utils-{branch} (= {version}), {common}",
            conflicts=f"nvidia-driver-{branch}-open",
        ),
        Package(
            f"nvidia-headless-{branch}-open",
            version,
            depends=common,
            conflicts=f"nvidia-headless-{branch}, nvidia-driver-{branch}",
        ),
        Package(
            f"nvidia-headless-{branch}",
            version,
            depends=common,
            conflicts=f"nvidia-headless-{branch}-open, nvidia-driver-{branch}-open",
        ),
        Package(
            f"nvidia-open-{branch}", version, depends=f"nvidia-driver-{branch}-open (= {version})"
        ),
        Package(f"cuda-drivers-{branch}", version, depends=f"nvidia-driver-{branch} (= {version})"),
        Package(
            f"nvidia-fabricmanager-{branch}",
            f"{upstream}-1",
            depends=f"nvidia-kernel-common-{branch}-server-{upstream}",
            files={
                "/usr/bin/nv-fabricmanager": ("nv-fabricmanager", 0o755),
                "/usr/lib/systemd/system/nvidia-fabricmanager.service": (
                    "nvidia-fabricmanager.service",
                    0o644,
                ),
            },
        ),
    ]


def docker_version(codename: str) -> str:
    return f"5:28.5.1-1~ubuntu.{DOCKER_CODENAMES[codename]}~{codename}"


def docker_packages(codename: str, engine: bool) -> list[Package]:
    """Docker CE's package names. With engine, docker-ce is built by repackage_as_docker_ce."""
    release = DOCKER_CODENAMES[codename]
    packages = [
        Package("containerd.io", "1.7.28-1", depends="containerd"),
        Package("docker-ce-cli", docker_version(codename)),
        Package("docker-buildx-plugin", f"0.29.1-1~ubuntu.{release}~{codename}"),
    ]
    if not engine:
        packages.append(Package("docker-ce", docker_version(codename), depends="containerd.io"))
    return packages


def fetch_debian_deb(name: str, proxy_url: str, folder: Path, suite: str = "bookworm") -> Path:
    """Download the .deb of `name` in Debian's `suite` through the apt proxy (none when
    proxy_url is empty), kept in folder."""
    proxies = {"http": proxy_url} if proxy_url else {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
    index_url = DEBIAN_MAIN_INDEX.replace("/bookworm/", f"/{suite}/")
    with opener.open(index_url, timeout=600) as response:
        index = lzma.decompress(response.read()).decode()
    stanza = next(block for block in index.split("\n\n") if block.startswith(f"Package: {name}\n"))
    filename = next(
        line.split(": ", 1)[1] for line in stanza.splitlines() if line.startswith("Filename: ")
    )
    target = folder / Path(filename).name
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        with opener.open(DEBIAN_POOL + filename, timeout=600) as response:
            partial.write_bytes(response.read())
        partial.rename(target)
    return target


def repackage_as_docker_ce(source: Path, codename: str, cache: Path) -> Path:
    """Debian's docker.io .deb under Docker CE's name and version (kept in cache)."""
    target = cache / f"{source.stem}-as-docker-ce-{codename}.deb"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory(dir=cache, prefix="repack-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["dpkg-deb", "-R", str(source), str(tree)], check=True)
        control = []
        renamed = {"Package": "docker-ce", "Version": docker_version(codename)}
        for line in (tree / "DEBIAN/control").read_text().splitlines():
            field = line.split(":", 1)[0]
            if field in ("Conflicts", "Replaces", "Breaks", "Provides"):
                continue
            if field == "Description":
                control += [
                    f"Description: stand-in docker-ce: Debian's {source.name} repackaged",
                    " Test double: the real Docker daemon under Docker CE's name.",
                ]
                break
            control.append(f"{field}: {renamed[field]}" if field in renamed else line)
        (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
        partial = Path(scratch) / "docker-ce.deb"
        subprocess.run(
            ["dpkg-deb", "-Zgzip", "-z1", "--build", str(tree), str(partial)],
            check=True,
            capture_output=True,
        )
        partial.rename(target)
    return target


def mig_manager_package() -> Package:
    """NVIDIA's nvidia-mig-manager .deb (a release asset of github.com/NVIDIA/mig-parted, in no apt
    repository): nvidia-mig-parted and the package's boot service, as stand-ins."""
    return Package(
        "nvidia-mig-manager",
        f"{MIG_MANAGER_VERSION}-1",
        depends="python3, python3-yaml",
        files={
            "/usr/bin/nvidia-mig-parted": ("nvidia-mig-parted", 0o755),
            "/usr/lib/systemd/system/nvidia-mig-manager.service": (
                "nvidia-mig-manager.service",
                0o644,
            ),
            "/etc/systemd/system/nvidia-mig-manager.service.d/override.conf": (
                "nvidia-mig-manager-override.conf",
                0o644,
            ),
            "/etc/nvidia-mig-manager/config.yaml": ("nvidia-mig-manager-config.yaml", 0o644),
        },
        scripts={"postinst": "nvidia-mig-manager.postinst"},
    )


def mig_manager_release(version: str = "") -> str:
    """Where the package lies, as on GitHub: <owner>/<repo>/releases/download/v<version>/<file>."""
    version = version or MIG_MANAGER_VERSION
    package = f"nvidia-mig-manager_{version}-1_amd64.deb"
    return f"NVIDIA/mig-parted/releases/download/v{version}/{package}"


def kubernetes_packages(
    minor: str = KUBERNETES_MINOR, versions: tuple[str, ...] = KUBERNETES_VERSIONS
) -> list[Package]:
    """pkgs.k8s.io's packages, their Depends as kubernetes/release (master,
    cmd/krel/templates/latest/metadata.yaml) gives them for 1.32 and later: kubelet needs
    kubernetes-cni >= 1.2.0, kubeadm, kubectl and cri-tools need nothing."""
    packages = [
        Package("cri-tools", f"{minor}.0-1.1", files={"/usr/bin/crictl": ("crictl", 0o755)}),
        Package(
            "kubernetes-cni", "1.5.1-1.1", files={"/opt/cni/bin/standin": ("record-args", 0o755)}
        ),
    ]
    for upstream in versions:
        version = f"{upstream}-1.1"
        packages += [
            Package("kubectl", version, files={"/usr/bin/kubectl": ("kubectl", 0o755)}),
            Package(
                "kubelet",
                version,
                depends="kubernetes-cni (>= 1.2.0)",
                # Like the real package, which ships the static pod folder.
                directories=("/etc/kubernetes/manifests",),
                files={
                    "/usr/bin/kubelet": ("kubelet", 0o755),
                    "/usr/lib/systemd/system/kubelet.service": ("kubelet.service", 0o644),
                },
            ),
            # No Depends: kubernetes/release's cmd/krel/templates/latest/metadata.yaml lists none
            # for kubeadm >= 1.32.0 (cri-tools and kubernetes-cni are installed on their own).
            Package(
                "kubeadm",
                version,
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


def _release(folder: Path, key: SigningKey, header: list[str], indexes: list[str]) -> None:
    """Write and sign folder/Release listing the given index files (relative to folder)."""
    lines = [*header, f"Date: {formatdate(usegmt=True)}", "SHA256:"]
    for name in indexes:
        data = (folder / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (folder / "Release").write_text("\n".join(lines) + "\n")
    key.sign_release(folder / "Release")


def _write_packages(folder: Path, root: Path, scan: str = ".") -> None:
    """Packages(.gz) in folder for the .debs under root/scan (Filename relative to root)."""
    packages = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", scan],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Packages").write_text(packages)
    with gzip.open(folder / "Packages.gz", "wt") as compressed:
        compressed.write(packages)


def write_flat_repository(folder: Path, key: SigningKey, label: str) -> None:
    """Write Packages(.gz) and a signed Release for the .debs in folder (a `Suites: /` repo)."""
    _write_packages(folder, folder)
    header = [f"Origin: {label}", f"Label: {label}", "Architectures: amd64"]
    _release(folder, key, header, ["Packages", "Packages.gz"])


def write_docker_repository(root: Path, key: SigningKey, codename: str) -> None:
    """Docker's layout: pool/stable/ with the .debs, dists/<codename>/ with a signed Release."""
    dist = root / "dists" / codename
    binary = dist / "stable" / "binary-amd64"
    _write_packages(binary, root, f"pool/stable/{codename}")
    header = [
        "Origin: Docker",
        "Label: Docker CE",
        f"Suite: {codename}",
        f"Codename: {codename}",
        "Architectures: amd64",
        "Components: stable",
    ]
    _release(dist, key, header, ["stable/binary-amd64/Packages", "stable/binary-amd64/Packages.gz"])


def build_repositories(www: Path, docker_engine: Path | None = None) -> None:
    """Build the stand-in repositories, their keys and the stand-in CNI manifest under www.

    docker_engine: Debian's docker.io .deb, repackaged as docker-ce; without it docker-ce is an
    empty stand-in (enough for the repositories' own tests, not to run containers).
    """
    key = SigningKey()
    try:
        with tempfile.TemporaryDirectory(prefix="gct-debs-") as scratch:
            flat = [
                (NVIDIA_REPO, NVIDIA_KEY, nvidia_packages(), "stand-in libnvidia-container"),
                (KUBERNETES_REPO, KUBERNETES_KEY, kubernetes_packages(), "stand-in pkgs.k8s.io"),
                (
                    kubernetes_repo(KUBERNETES_PREVIOUS_MINOR),
                    f"{kubernetes_repo(KUBERNETES_PREVIOUS_MINOR)}/Release.key",
                    kubernetes_packages(KUBERNETES_PREVIOUS_MINOR, KUBERNETES_PREVIOUS_VERSIONS),
                    "stand-in pkgs.k8s.io",
                ),
            ]
            drivers = cuda_packages()
            for distribution in CUDA_DISTRIBUTIONS:
                folder = cuda_repo(distribution)
                flat.append((folder, f"{folder}/{CUDA_KEY_NAME}", drivers, "stand-in NVIDIA CUDA"))
            for folder, key_path, packages, label in flat:
                repo = www / folder
                repo.mkdir(parents=True, exist_ok=True)
                for package in packages:
                    package.build(repo, Path(scratch) / folder.replace("/", "_"))
                write_flat_repository(repo, key, label)
                (www / key_path).write_text(key.export_armored())
            docker = www / DOCKER_REPO
            for codename in DOCKER_CODENAMES:
                pool = docker / "pool" / "stable" / codename
                pool.mkdir(parents=True, exist_ok=True)
                for package in docker_packages(codename, docker_engine is not None):
                    package.build(pool, Path(scratch) / codename)
                if docker_engine is not None:
                    repacked = repackage_as_docker_ce(docker_engine, codename, docker_engine.parent)
                    shutil.copy(repacked, pool / f"docker-ce_{codename}_amd64.deb")
                write_docker_repository(docker, key, codename)
            (www / DOCKER_KEY).write_text(key.export_armored())
            release = www / mig_manager_release()
            release.parent.mkdir(parents=True, exist_ok=True)
            built = mig_manager_package().build(release.parent, Path(scratch) / "mig")
            built.rename(release)
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
