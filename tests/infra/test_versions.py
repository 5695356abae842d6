"""The pinned Kubernetes versions are supported today, and every place that names them agrees.

The support dates are a table in infra/versions.py (sources in docs/kubernetes-versions.md): this
test starts failing on the day a pinned minor leaves EKS standard support or upstream support, so
that the pin moves before users deploy an unsupported version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import versions
from infra.render.program import ProgramRun, Recorded, run_stack
from infra.versions import KubernetesMinor
from tests.infra.conftest import EKS_STACK, KUBEADM_STACK
from tests.nodes.harness import standin_repo

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def support_problems(pinned: str, kubeadm: str, today: date) -> list[str]:
    """Why the pinned EKS minor and kubeadm version are not supported on ``today``."""
    minor = versions.KUBERNETES_SUPPORT.get(pinned)
    if minor is None:
        return [f"Kubernetes {pinned} is not in infra/versions.py's KUBERNETES_SUPPORT table"]
    problems = []
    if today > minor.eks_end_of_standard_support:
        problems.append(
            f"EKS standard support for Kubernetes {pinned} ended on "
            f"{minor.eks_end_of_standard_support}: move KUBERNETES_VERSION to a newer minor"
        )
    kubeadm_minor = versions.KUBERNETES_SUPPORT.get(kubeadm.rpartition(".")[0])
    if kubeadm_minor is None:
        problems.append(f"kubeadm's {kubeadm} is of no minor in KUBERNETES_SUPPORT")
    elif today > kubeadm_minor.upstream_end_of_life:
        problems.append(
            f"Kubernetes {kubeadm_minor.minor} reached its upstream end of life on "
            f"{kubeadm_minor.upstream_end_of_life}: kubeadm clusters get no more patches"
        )
    elif kubeadm != kubeadm_minor.latest_patch:
        problems.append(f"kubeadm pins {kubeadm}, not the latest {kubeadm_minor.latest_patch}")
    return problems


def test_the_pinned_versions_are_supported_today() -> None:
    assert (
        support_problems(versions.KUBERNETES_VERSION, versions.KUBEADM_KUBERNETES_VERSION, today())
        == []
    )


def today() -> date:
    return date.today()


def test_the_check_fails_once_support_ends() -> None:
    minor = versions.KUBERNETES_SUPPORT[versions.KUBERNETES_VERSION]
    after_eks = support_problems(
        minor.minor, minor.latest_patch, minor.eks_end_of_standard_support.replace(year=2100)
    )
    assert any("EKS standard support" in p for p in after_eks)
    assert any("upstream end of life" in p for p in after_eks)
    assert support_problems("1.30", minor.latest_patch, date(2026, 1, 1)) == [
        "Kubernetes 1.30 is not in infra/versions.py's KUBERNETES_SUPPORT table"
    ]
    older_patch = f"{minor.minor}.0"
    assert support_problems(minor.minor, older_patch, versions.KUBERNETES_SUPPORT_CHECKED) == [
        f"kubeadm pins {older_patch}, not the latest {minor.latest_patch}"
    ]


@pytest.mark.parametrize("minor", versions.KUBERNETES_SUPPORT.values(), ids=str)
def test_the_table_is_consistent(minor: KubernetesMinor) -> None:
    assert minor.latest_patch.startswith(f"{minor.minor}.")
    assert minor.latest_patch_released <= versions.KUBERNETES_SUPPORT_CHECKED
    assert minor.eks_end_of_standard_support < minor.eks_end_of_extended_support


def _yaml(path: Path) -> dict[str, object]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def test_every_place_that_names_the_versions_agrees() -> None:
    eks_config = _yaml(ROOT / "stacks" / "eks" / "Pulumi.example.yaml")["config"]
    assert isinstance(eks_config, dict)
    assert eks_config["gpu-cluster-eks:kubernetesVersion"] == versions.KUBERNETES_VERSION
    kubeadm = versions.KUBEADM_KUBERNETES_VERSION
    for path in (
        PLAYBOOKS / "roles" / "kubernetes_node" / "defaults" / "main.yml",
        PLAYBOOKS / "inventory" / "group_vars" / "all.yml",
    ):
        assert _yaml(path)["kubernetes_node_version"] == kubeadm, path
    for role in ("kubeadm_worker", "kubeadm_control_plane"):
        defaults = (PLAYBOOKS / "roles" / role / "defaults" / "main.yml").read_text()
        assert f"default('{kubeadm}')" in defaults, role
    # The node tests' stand-in repository offers the pin and a newer patch it must not take.
    assert standin_repo.KUBERNETES_MINOR == versions.KUBERNETES_VERSION
    assert kubeadm in standin_repo.KUBERNETES_VERSIONS
    assert standin_repo.KUBERNETES_VERSIONS[-1] != kubeadm


@pytest.mark.parametrize("chart", versions.PINNED_CHARTS, ids=lambda c: c.name)
def test_every_chart_pins_its_publisher_s_digest_or_says_why_not(
    chart: versions.HelmChart,
) -> None:
    if chart.sha256 is None:
        assert chart.digest_unknown.strip(), f"{chart.archive}: no sha256, and no reason"
    else:
        assert HEX_DIGEST.match(chart.sha256), chart.sha256
        assert not chart.digest_unknown, f"{chart.archive}: a digest and a reason for none"


def test_a_chart_without_digest_or_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="pin sha256, or say in digest_unknown why"):
        versions.HelmChart("x", "https://example.invalid/charts", "1.0.0")


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# An image reference in a string literal of infra/: registry or owner, a path, a tag.
IMAGE_LITERAL = re.compile(r"[\"']([a-z0-9.-]+/[a-z0-9./_-]+:[A-Za-z0-9][A-Za-z0-9._-]*)[\"']")


def versioned_images() -> dict[str, str]:
    """Every image infra/versions.py pins, by constant name (``*_IMAGE``)."""
    return {name: value for name, value in vars(versions).items() if name.endswith("_IMAGE")}


def test_every_image_is_pinned_by_digest_or_says_why_not() -> None:
    images = versioned_images()
    assert len(images) >= 7  # the collector found them: a check over nothing would pass
    for name, image in images.items():
        reference, _, digest = image.partition("@")
        assert reference in versions.IMAGE_DIGESTS, f"{name}: {reference} is not in IMAGE_DIGESTS"
        known, why = versions.IMAGE_DIGESTS[reference]
        assert why.strip(), f"{reference}: say where its digest comes from, or why none"
        if known is None:
            assert why.startswith("unknown"), f"{reference}: no digest, so say why it is unknown"
        else:
            assert DIGEST.match(known), f"{reference}: {known} is not a sha256 digest"
            if name != "DCGM_EXPORTER_IMAGE":  # its chart takes the digest in the tag, below
                assert digest == known, f"{name} is used without its digest"
    assert versions.DCGM_EXPORTER_IMAGE_TAG.endswith(
        "@" + str(versions.IMAGE_DIGESTS[versions.DCGM_EXPORTER_IMAGE][0])
    )


def test_no_image_is_named_outside_versions() -> None:
    """A new image must go through infra/versions.py, where the check above sees it."""
    for path in sorted([*(ROOT / "infra").rglob("*.py"), *(ROOT / "stacks").rglob("*.py")]):
        if path.name == "versions.py":
            continue
        found = IMAGE_LITERAL.findall(path.read_text())
        assert found == [], f"{path.relative_to(ROOT)} names {found}: pin it in infra/versions.py"


def test_the_literal_check_sees_an_image() -> None:
    assert IMAGE_LITERAL.findall('image = "ghcr.io/acme/tool:1.2.3"') == ["ghcr.io/acme/tool:1.2.3"]
    assert IMAGE_LITERAL.findall('url = "https://example.com/x"') == []


def images_in(value: Any) -> Iterator[str]:
    """The values of ``image`` and ``imageName`` keys (containers, CloudNativePG's clusters)
    anywhere in an object, JSON documents in strings (a ConfigMap's helper pod) included."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("image", "imageName") and isinstance(item, str):
                yield item
            else:
                yield from images_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from images_in(item)
    elif isinstance(value, str) and value.startswith("{"):
        try:
            yield from images_in(json.loads(value))
        except ValueError:
            return


def unpinned_images(run: ProgramRun) -> list[str]:
    """The images of the stack's own objects that are not ``pinned()`` ones of IMAGE_DIGESTS."""
    allowed = {versions.pinned(image) for image in versions.IMAGE_DIGESTS}
    return sorted(
        {
            image
            for resource in run.resources
            for image in images_in(resource.inputs)
            if image not in allowed
        }
    )


@pytest.mark.parametrize(
    ("stack", "overrides"),
    [
        (EKS_STACK, {}),
        (EKS_STACK, {"profilerStore": "rds"}),
        (KUBEADM_STACK, {"trialRunner": {"maxGpus": 4}}),
    ],
    ids=["eks", "eks-rds", "kubeadm-trials"],
)
def test_every_image_the_stacks_create_is_pinned_or_says_why_not(
    stack: Path, overrides: dict[str, Any]
) -> None:
    """What the programs declare, however the image string was built (charts' images are their
    owners', but for dcgm-exporter's, whose tag carries the digest: tested above)."""
    run = run_stack(stack, overrides)
    assert len({i for r in run.resources for i in images_in(r.inputs)}) >= 3
    assert unpinned_images(run) == []


def test_the_object_check_sees_an_image_built_outside_versions() -> None:
    pod = {"spec": {"containers": [{"image": "docker.io/library/alpine:3.20"}]}}
    config = {"data": {"helperPod.yaml": json.dumps(pod)}}
    # A known digest left off, in a CloudNativePG cluster's imageName.
    cluster = {"spec": {"imageName": "docker.io/rancher/local-path-provisioner:v0.0.37"}}
    run = ProgramRun(
        resources=[
            Recorded("kubernetes:core/v1:ConfigMap", "c", config),
            Recorded("kubernetes:postgresql.cnpg.io/v1:Cluster", "d", cluster),
        ],
        outputs={},
    )
    assert unpinned_images(run) == [
        "docker.io/library/alpine:3.20",
        "docker.io/rancher/local-path-provisioner:v0.0.37",
    ]
