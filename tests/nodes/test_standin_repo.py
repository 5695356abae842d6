"""The stand-in vendor repositories, built without booting anything (no root needed).

They are test doubles for NVIDIA's container toolkit repository and pkgs.k8s.io; these tests
check that what apt will be given is consistent and really signed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
    assert ("cri-tools", "1.31.1-1.1") in versions
    for package in packages:
        assert (www / standin_repo.KUBERNETES_REPO / package["Filename"]).is_file()


def test_toolkit_runtime_wraps_runc_and_logs(www: Path, tmp_path: Path) -> None:
    repo = www / standin_repo.NVIDIA_REPO
    deb = next(repo.glob("nvidia-container-toolkit-base_1.17.3-1_amd64.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    runtime = tmp_path / "usr/bin/nvidia-container-runtime"
    assert runtime.stat().st_mode & 0o111
    text = runtime.read_text()
    assert "/var/log/nvidia-container-runtime-standin.log" in text
    assert 'exec /usr/sbin/runc "$@"' in text
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Depends", "Version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Depends: runc" in fields
    assert "Version: 1.17.3-1" in fields


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
