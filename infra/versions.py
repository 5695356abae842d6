"""Every chart, image and Kubernetes version the components install, pinned in one place.

Bump a version here, run ``pytest tests/infra`` and read the chart's changelog for renamed values.
A chart's ``sha256`` pins its archive as the publisher serves it (infra/chart_archive.py verifies
it before `pulumi up` installs it, infra/render/charts.py before it renders it); a version bump
needs the new archive's digest from the repository's index.yaml (infra/README.md says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True)
class HelmChart:
    """A chart in a Helm repository or an OCI registry, at an exact version.

    ``sha256``: the digest of the archive (``<name>-<version>.tgz``) as its publisher serves it,
    read from the repository's index.yaml (``digest``); None where it could not be read when the
    chart was pinned, and ``digest_unknown`` says why. Either way an archive fetched (by
    `--pull-charts` or `pulumi up`) is checked against the digest the repository's index gives
    at that time, as Helm does; an OCI chart's layers Helm checks against the registry's manifest.
    """

    name: str
    repo: str
    version: str
    sha256: str | None = None
    digest_unknown: str = ""

    def __post_init__(self) -> None:
        if (self.sha256 is None) == (not self.digest_unknown):
            raise ValueError(f"{self.name}: pin sha256, or say in digest_unknown why it is not")

    @property
    def is_oci(self) -> bool:
        return self.repo.startswith("oci://")

    @property
    def reference(self) -> str:
        """What `helm install` takes: the chart's name in a classic repository, its URL in OCI."""
        return f"{self.repo}/{self.name}" if self.is_oci else self.name

    @property
    def archive(self) -> str:
        """The archive's file name, as `helm pull` writes it (the chart cache's names)."""
        return f"{self.name}-{self.version}.tgz"


# Digests read from the publishers' index.yaml (their gh-pages branches) on 2026-11-29.
UNREAD_INDEX = "its repository's index.yaml was too large to read when pinned"
NVIDIA_DEVICE_PLUGIN = HelmChart(
    name="nvidia-device-plugin",
    repo="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",  # node-feature-discovery 0.19.0 as a dependency the repository resolves
    sha256="9e5642bcdd3805c6e931f9d3ca542677d1f714d68c14c1364892011e67d9a606",
)
KUBE_PROMETHEUS_STACK = HelmChart(
    name="kube-prometheus-stack",
    repo="https://prometheus-community.github.io/helm-charts",
    version="88.5.3",  # prometheus-operator v0.93.1, grafana chart 12.11.1
    digest_unknown=UNREAD_INDEX,
)
DCGM_EXPORTER = HelmChart(
    name="dcgm-exporter",
    repo="https://nvidia.github.io/dcgm-exporter/helm-charts",
    version="4.8.2",
    sha256="1c5535c03ebab3f021444df6016fce1cd7871385122e115c6ed24c804b623803",
)
PROMETHEUS_ADAPTER = HelmChart(
    name="prometheus-adapter",
    repo="https://prometheus-community.github.io/helm-charts",
    version="5.3.0",
    digest_unknown=UNREAD_INDEX,
)
KEDA = HelmChart(
    name="keda",
    repo="https://kedacore.github.io/charts",
    version="2.20.2",  # its CRDs are templates: installed and upgraded with the release
    sha256="db60b1fa60f0565fefa4ce2f87e855b6a8854363ee82962fbe28a12a70d64c4c",
)
# Karpenter's OCI charts: the CRDs in a chart of their own, so that upgrades update them (Helm
# never upgrades a chart's crds/ folder); the controller's chart is installed without its crds/.
# An OCI registry has no index.yaml: Helm checks the layer against the registry's manifest.
OCI_DIGEST = "an OCI registry publishes no index.yaml; Helm checks the layer's digest on pull"
KARPENTER_CRD = HelmChart(
    name="karpenter-crd",
    repo="oci://public.ecr.aws/karpenter",
    version="1.14.1",
    digest_unknown=OCI_DIGEST,
)
KARPENTER = HelmChart(
    name="karpenter",
    repo="oci://public.ecr.aws/karpenter",
    version="1.14.1",
    digest_unknown=OCI_DIGEST,
)
# AWS' EFA device plugin (vpc.amazonaws.com/efa on EFA nodes), installed where a GPU pool uses EFA.
EFA_DEVICE_PLUGIN = HelmChart(
    name="aws-efa-k8s-device-plugin",
    repo="https://aws.github.io/eks-charts",
    version="v0.5.30",  # plugin v0.5.20
    sha256="43b3d666f81a40b7f7ac88ee04a64954abaaa061b1e5f54dc7ce4beb3374e32a",
)

# The profiler's store: the CloudNativePG operator (its CRDs are templates of the chart, so they
# are upgraded with it). Clusters without a storage provisioner get local-path-provisioner from
# its release manifest (infra/storage.py): Rancher publishes no chart archive of it.
CLOUDNATIVE_PG = HelmChart(
    name="cloudnative-pg",
    repo="https://cloudnative-pg.github.io/charts",
    version="0.29.0",  # operator 1.30.0
    sha256="668e065ff53508d58238788fd35b355a925060843629a951df0e6a9362e6d32f",
)

# Every chart the stacks install, for `python -m infra.render --pull-charts`.
PINNED_CHARTS = (
    NVIDIA_DEVICE_PLUGIN,
    KUBE_PROMETHEUS_STACK,
    DCGM_EXPORTER,
    PROMETHEUS_ADAPTER,
    KEDA,
    KARPENTER_CRD,
    KARPENTER,
    CLOUDNATIVE_PG,
    EFA_DEVICE_PLUGIN,
)

# Images by the digest of their multi-arch index, the tag kept for people to read; where no
# digest is known, the reason instead (a pin by digest must be one that was checked). The digests
# were taken from public repositories that pin the same tag, at least two of them agreeing
# (counted with the search tool's exact-string index of public code), not resolved from a
# registry here; `docker buildx imagetools inspect IMAGE` confirms one (docs/operations.md,
# "Supply chain"). tests/infra/test_versions.py fails on an image of this file missing here.
IMAGE_DIGESTS: dict[str, tuple[str | None, str]] = {
    "vllm/vllm-openai:v0.11.0": (
        "sha256:014a95f21c9edf6abe0aea6b07353f96baa4ec291c427bb1176dc7c93a85845c",
        "ten public records agree (Dockerfiles, scripts, notes of separate projects)",
    ),
    "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless": (
        "sha256:60d3b00ac80b4ae77f94dae2f943685605585ad9e92fdccda3154d009ae317cc",
        "ten public records agree (Go, Terraform, Dockerfiles, notes of separate projects)",
    ),
    "ghcr.io/cloudnative-pg/pgbouncer:1.25.1": (
        "sha256:e6ddfe22d845e603825e235dd8334b21ecd125abea2a2172478f556b8dee2bb8",
        "four public records of the tag agree, and one of its -trixie alias",
    ),
    "ghcr.io/cloudnative-pg/postgresql:18.4-system-trixie": (
        None,
        "unknown: CloudNativePG rebuilds this tag for OS fixes, and public records name four "
        "different digests",
    ),
    "docker.io/rancher/local-path-provisioner:v0.0.37": (
        "sha256:e757967a5ec338f6a9b371c5a9688bedaa8c3578ea3dd4db329ea0084be0a86f",
        "ten public records agree (Rust, TypeScript, Go, Nix, Python, a Dockerfile, notes)",
    ),
    "docker.io/library/busybox:1.37.0": (
        None,
        "unknown: the tag was republished: public records name eight different digests",
    ),
    "public.ecr.aws/aws-cli/aws-cli:2.32.9": (
        None,
        "unknown: no public record of this registry's digest (Docker Hub's amazon/aws-cli is "
        "another push)",
    ),
    "ghcr.io/centaurusinfra/gpu-profiler:0.1.0": (
        None,
        "unknown until the release workflow pushes it; a cluster checks its cosign signature "
        "instead (docs/operations.md)",
    ),
}


def pinned(image: str) -> str:
    """``repository:tag@sha256:...`` where the digest is known, else ``image`` as it is."""
    digest, _ = IMAGE_DIGESTS[image]
    return f"{image}@{digest}" if digest else image


# The example GPU inference server (vLLM's OpenAI-compatible server; it exports request metrics
# on /metrics) and the small model it serves, which fits any NVIDIA GPU of the GPU pools.
EXAMPLE_INFERENCE_IMAGE = pinned("vllm/vllm-openai:v0.11.0")
EXAMPLE_INFERENCE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

# dcgm-exporter's image for chart 4.8.2 (DCGM 4.5.3); the chart's own default, pinned explicitly.
# The chart writes "<repository>:<tag>", so the digest rides in the tag.
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
DCGM_EXPORTER_IMAGE_TAG = pinned(DCGM_EXPORTER_IMAGE).partition(":")[2]
# The label naming the node on dcgm-exporter's series: "Hostname" up to this version ("hostname"
# later); the ServiceMonitor copies either into this one (platform.node_label_relabelings).
DCGM_NODE_LABEL = "Hostname"

# The profiler's image, as the release workflow publishes it: pushing the tag v<version> builds and
# pushes <repository>:<version>, <version> being pyproject.toml's project.version (a test checks
# that they agree). Stacks override it with config `profilerImage`.
PROFILER_IMAGE_REPOSITORY = "ghcr.io/centaurusinfra/gpu-profiler"
PROFILER_VERSION = "0.1.0"
PROFILER_IMAGE = pinned(f"{PROFILER_IMAGE_REPOSITORY}:{PROFILER_VERSION}")

# PostgreSQL and PgBouncer images of the CloudNativePG cluster: operator 1.30.0's defaults, pinned
# so that an operator upgrade does not roll the database by itself. local-path-provisioner's image
# (rancher/local-path-provisioner@v0.0.37: deploy/local-path-storage.yaml) and its helper (it
# creates and removes volume folders on the node), pinned instead of busybox:latest.
POSTGRESQL_IMAGE = pinned("ghcr.io/cloudnative-pg/postgresql:18.4-system-trixie")
PGBOUNCER_IMAGE = pinned("ghcr.io/cloudnative-pg/pgbouncer:1.25.1")
LOCAL_PATH_PROVISIONER_IMAGE = pinned("docker.io/rancher/local-path-provisioner:v0.0.37")
LOCAL_PATH_HELPER_IMAGE = pinned("docker.io/library/busybox:1.37.0")
# Amazon RDS for PostgreSQL (profilerStore: rds): the major version; RDS applies minor upgrades.
RDS_POSTGRESQL_VERSION = "18"
RDS_PARAMETER_GROUP_FAMILY = "postgres18"
# The AWS CLI that reads RDS's master secret in the store's bootstrap Job.
AWS_CLI_IMAGE = pinned("public.ecr.aws/aws-cli/aws-cli:2.32.9")


@dataclass(frozen=True)
class KubernetesMinor:
    """When a Kubernetes minor version stops being supported, upstream and on EKS.

    ``latest_patch``: the newest patch release the sources showed on KUBERNETES_SUPPORT_CHECKED
    (kubeadm clusters install it).
    """

    minor: str
    latest_patch: str
    latest_patch_released: date
    upstream_end_of_life: date
    eks_end_of_standard_support: date
    eks_end_of_extended_support: date


# Checked on this date against: kubernetes.io/releases/<minor>/ (patches, maintenance mode, end of
# life), docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html and endoflife.date/
# amazon-eks (EKS standard and extended support). docs/kubernetes-versions.md holds the table with
# its sources; tests/infra/test_versions.py fails once a pinned minor is past its end of support.
KUBERNETES_SUPPORT_CHECKED = date(2026, 11, 26)
KUBERNETES_SUPPORT = {
    minor.minor: minor
    for minor in (
        KubernetesMinor(
            minor="1.35",
            latest_patch="1.35.9",
            latest_patch_released=date(2026, 9, 15),
            upstream_end_of_life=date(2027, 2, 28),
            eks_end_of_standard_support=date(2027, 3, 27),
            eks_end_of_extended_support=date(2028, 3, 27),
        ),
    )
}
# Kubernetes minor version of EKS clusters; also the schema version objects are validated against.
KUBERNETES_VERSION = "1.35"
# The version kubeadm clusters install (the playbooks' kubernetes_node_version default): its latest
# patch release.
KUBEADM_KUBERNETES_VERSION = KUBERNETES_SUPPORT[KUBERNETES_VERSION].latest_patch
