"""The stand-in vendor repositories, built without booting anything (no root needed).

They are test doubles for NVIDIA's container toolkit repository and pkgs.k8s.io; these tests
check that what apt will be given is consistent and really signed.
"""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import tomllib
import types
from pathlib import Path
from types import ModuleType

import pytest

from tests.nodes.harness import standin_repo
from tests.nodes.harness.ansible_run import RECAP_LINE

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("dpkg-deb", "dpkg-scanpackages", "gpg", "gpgv")),
    reason="needs dpkg-deb, dpkg-scanpackages (dpkg-dev), gpg and gpgv",
)


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www")
    standin_repo.build_repositories(root)
    return root


def _packages(repo: Path) -> list[dict[str, str]]:
    stanzas = (repo / "Packages").read_text().strip().split("\n\n")
    return [
        dict(line.split(": ", 1) for line in stanza.splitlines() if not line.startswith(" "))
        for stanza in stanzas
    ]


@pytest.mark.parametrize(
    ("folder", "key"),
    [
        (standin_repo.NVIDIA_REPO, standin_repo.NVIDIA_KEY),
        (standin_repo.KUBERNETES_REPO, standin_repo.KUBERNETES_KEY),
        (
            standin_repo.kubernetes_repo(standin_repo.KUBERNETES_PREVIOUS_MINOR),
            f"{standin_repo.kubernetes_repo(standin_repo.KUBERNETES_PREVIOUS_MINOR)}/Release.key",
        ),
    ],
)
def test_release_is_signed_by_the_published_key(
    www: Path, tmp_path: Path, folder: str, key: str
) -> None:
    keyring = tmp_path / "keyring.gpg"
    subprocess.run(
        ["gpg", "--batch", "--yes", "--dearmor", "-o", str(keyring), str(www / key)], check=True
    )
    repo = www / folder
    for args in (
        [str(repo / "InRelease")],
        [str(repo / "Release.gpg"), str(repo / "Release")],
    ):
        subprocess.run(["gpgv", "--keyring", str(keyring), *args], check=True, capture_output=True)
    (repo / "Release").write_text((repo / "Release").read_text() + "Tampered: yes\n")
    tampered = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(repo / "Release.gpg"), str(repo / "Release")],
        capture_output=True,
        check=False,
    )
    assert tampered.returncode != 0


def test_kubernetes_repo_offers_three_patch_versions_with_real_package_names(www: Path) -> None:
    packages = _packages(www / standin_repo.KUBERNETES_REPO)
    versions = {(p["Package"], p["Version"]) for p in packages}
    for name in ("kubelet", "kubeadm", "kubectl"):
        for upstream in standin_repo.KUBERNETES_VERSIONS:
            assert (name, f"{upstream}-1.1") in versions
    assert ("cri-tools", "1.35.0-1.1") in versions
    for package in packages:
        assert (www / standin_repo.KUBERNETES_REPO / package["Filename"]).is_file()


def test_kubeadm_depends_on_nothing_as_the_real_one_since_1_32(www: Path) -> None:
    """kubernetes/release cmd/krel/templates/latest/metadata.yaml: no dependencies for kubeadm
    >= 1.32.0, kubelet needs kubernetes-cni >= 1.2.0; crictl comes only with cri-tools."""
    for folder in (
        standin_repo.KUBERNETES_REPO,
        standin_repo.kubernetes_repo(standin_repo.KUBERNETES_PREVIOUS_MINOR),
    ):
        packages = _packages(www / folder)
        assert all("Depends" not in p for p in packages if p["Package"] == "kubeadm")
        assert {p.get("Depends") for p in packages if p["Package"] == "kubelet"} == {
            "kubernetes-cni (>= 1.2.0)"
        }


@pytest.mark.parametrize(
    ("version", "units"),
    [("1.17.3", None), ("1.18.0", "etc/systemd/system"), ("1.20.0", "lib/systemd/system")],
)
def test_the_toolkits_cdi_refresh_units_lie_where_its_packaging_puts_them(
    www: Path, tmp_path: Path, version: str, units: str | None
) -> None:
    """NVIDIA/nvidia-container-toolkit packaging/debian/nvidia-container-toolkit-base.install:
    none before 1.18, /etc/systemd/system/ at v1.18.0 to v1.19.1, /lib/systemd/system/ at
    v1.20.0."""
    repo = www / standin_repo.NVIDIA_REPO
    deb = next(repo.glob(f"nvidia-container-toolkit-base_{version}-1_amd64.deb"))
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], check=True, capture_output=True, text=True
    ).stdout
    found = {
        line.split()[-1].lstrip("./") for line in listing.splitlines() if "cdi-refresh" in line
    }
    expected = {f"{units}/nvidia-cdi-refresh.{kind}" for kind in ("path", "service")}
    assert {path for path in found if "systemd" in path} == (expected if units else set())


def test_the_previous_minor_has_a_repository_of_its_own(www: Path) -> None:
    """As pkgs.k8s.io: a cluster goes from 1.34 to 1.35 by switching repositories."""
    folder = standin_repo.kubernetes_repo(standin_repo.KUBERNETES_PREVIOUS_MINOR)
    versions = {(p["Package"], p["Version"]) for p in _packages(www / folder)}
    for name in ("kubelet", "kubeadm", "kubectl"):
        assert {v for n, v in versions if n == name} == {
            f"{upstream}-1.1" for upstream in standin_repo.KUBERNETES_PREVIOUS_VERSIONS
        }
    assert ("cri-tools", "1.34.0-1.1") in versions


def _standin_runtime(www: Path, tmp_path: Path) -> ModuleType:
    """The stand-in runtime from the newest toolkit .deb, loaded as a module (it is Python)."""
    repo = www / standin_repo.NVIDIA_REPO
    deb = next(repo.glob("nvidia-container-toolkit-base_1.18.0-1_amd64.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    runtime = tmp_path / "usr/bin/nvidia-container-runtime"
    assert runtime.stat().st_mode & 0o111
    loader = importlib.machinery.SourceFileLoader("standin_runtime", str(runtime))
    module = types.ModuleType(loader.name)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("env", "mounts", "caps", "envvar_allowed", "expected"),
    [
        (["NVIDIA_VISIBLE_DEVICES=all"], [], [], False, []),
        (["NVIDIA_VISIBLE_DEVICES=all"], [], [], True, ["0", "1"]),
        (["NVIDIA_VISIBLE_DEVICES=all"], [], ["CAP_SYS_ADMIN"], False, ["0", "1"]),
        (["NVIDIA_VISIBLE_DEVICES=GPU-standin-1"], [], ["CAP_SYS_ADMIN"], False, ["1"]),
        (
            ["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"],
            ["/var/run/nvidia-container-devices/GPU-standin-0"],
            [],
            False,
            ["0"],
        ),
        ([], [], [], True, []),
        (["NVIDIA_VISIBLE_DEVICES=void"], [], ["CAP_SYS_ADMIN"], True, []),
    ],
)
def test_standin_runtime_grants_gpus_by_the_toolkits_rules(
    www: Path,
    tmp_path: Path,
    *,
    env: list[str],
    mounts: list[str],
    caps: list[str],
    envvar_allowed: bool,
    expected: list[str],
) -> None:
    runtime = _standin_runtime(www, tmp_path)
    runtime.LOG = str(tmp_path / "runtime.log")
    spec = {
        "process": {"env": env, "capabilities": {"bounding": caps}},
        "mounts": [{"destination": path, "source": "/dev/null"} for path in mounts],
    }
    config = {
        "accept-nvidia-visible-devices-as-volume-mounts": True,
        "accept-nvidia-visible-devices-envvar-when-unprivileged": envvar_allowed,
    }
    assert runtime.granted(spec, config) == expected


def test_the_packaged_toolkit_config_leaves_the_isolation_keys_at_the_toolkits_defaults(
    www: Path, tmp_path: Path
) -> None:
    """Like the real package: the role, not the package, must close the envvar leak."""
    deb = next((www / standin_repo.NVIDIA_REPO).glob("nvidia-container-toolkit-base_1.18.0-1_*"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    config = tomllib.loads((tmp_path / "etc/nvidia-container-runtime/config.toml").read_text())
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged" not in config
    runtime = _standin_runtime(www, tmp_path / "runtime")
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}
    runtime.LOG = str(tmp_path / "runtime.log")
    assert runtime.granted(spec, config) == ["0", "1"]


def test_cuda_and_docker_repositories_have_the_real_layouts_and_names(www: Path) -> None:
    for distribution in standin_repo.CUDA_DISTRIBUTIONS:
        repo = www / standin_repo.cuda_repo(distribution)
        names = {package["Package"] for package in _packages(repo)}
        for branch in standin_repo.DRIVER_VERSIONS:
            assert {
                f"nvidia-headless-{branch}-open",
                f"nvidia-headless-{branch}",
                f"nvidia-utils-{branch}",
                f"cuda-drivers-{branch}",
                f"nvidia-open-{branch}",
                f"nvidia-fabricmanager-{branch}",
            } <= names
        assert (repo / standin_repo.CUDA_KEY_NAME).is_file()
    docker = www / standin_repo.DOCKER_REPO
    for codename in standin_repo.DOCKER_CODENAMES:
        binary = docker / "dists" / codename / "stable" / "binary-amd64"
        packages = _packages(binary)
        assert {package["Package"] for package in packages} == {
            "docker-ce",
            "docker-ce-cli",
            "containerd.io",
            "docker-buildx-plugin",
        }
        for package in packages:
            assert f"/{codename}/" in package["Filename"]
            assert (docker / package["Filename"]).is_file()
        assert (docker / "dists" / codename / "InRelease").is_file()
    assert (www / standin_repo.DOCKER_KEY).is_file()


def test_fabric_manager_depends_on_its_drivers_kernel_common_release(www: Path) -> None:
    """As Ubuntu's packages do (packages.ubuntu.com, fabric-manager-580 and
    nvidia-graphics-drivers-580): Fabric Manager needs the kernel-common files of exactly its own
    driver release, which only that release's kernel-common package provides."""
    packages = _packages(www / standin_repo.cuda_repo("ubuntu2404"))
    by_name: dict[str, list[dict[str, str]]] = {}
    for package in packages:
        by_name.setdefault(package["Package"], []).append(package)
    for upstream in standin_repo.DRIVER_VERSIONS["580"]:
        fabric = next(
            package
            for package in by_name["nvidia-fabricmanager-580"]
            if package["Version"] == f"{upstream}-1"
        )
        assert fabric["Depends"] == f"nvidia-kernel-common-580-server-{upstream}"
        providers = [
            (package["Package"], package["Version"])
            for package in packages
            if package.get("Provides") == f"nvidia-kernel-common-580-server-{upstream}"
        ]
        assert providers == [("nvidia-kernel-common-580-server", f"{upstream}-0ubuntu1")]
        headless = next(
            package
            for package in by_name["nvidia-headless-580-open"]
            if package["Version"] == f"{upstream}-0ubuntu1"
        )
        assert headless["Depends"] == f"nvidia-kernel-common-580 (= {upstream}-0ubuntu1)"
    (nvlsm,) = by_name["nvlsm"]
    assert nvlsm["Version"] == standin_repo.NVLSM_VERSION
    assert "Depends" not in nvlsm


def test_recap_lines_are_parsed() -> None:
    line = (
        "gpu-cp-1                   : ok=56   changed=20   unreachable=0    failed=1    skipped=9"
    )
    match = RECAP_LINE.search(line)
    assert match is not None
    assert (match["host"], match["ok"], match["changed"], match["failed"]) == (
        "gpu-cp-1",
        "56",
        "20",
        "1",
    )
