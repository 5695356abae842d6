"""Every chart, image and Kubernetes version the components install, pinned in one place.

Bump a version here, run ``pytest tests/infra`` and read the chart's changelog for renamed values.
A chart's ``sha256`` pins the archives the render checks may read (infra/render/charts.py verifies
every archive it loads); a version bump needs the new archive's digest (infra/README.md says how).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True)
class HelmChart:
    """A chart in a Helm repository, at an exact version.

    ``sha256``: the digests of the chart archive (``<name>-<version>.tgz``) that may be trusted:
    the one the repository publishes (its index.yaml's ``digest``) where it is known, and the one
    packaged from the chart's source at the same version that CI renders, where that differs.
    """

    name: str
    repo: str
    version: str
    # A chart published in no Helm repository: its folder in ``repo``'s source archive at the tag
    # ``v<version>``. `python -m infra.render --pull-charts` packages it into the chart cache, and
    # the stack installs it from there.
    source_path: str | None = None
    sha256: tuple[str, ...] = ()

    @property
    def is_oci(self) -> bool:
        return self.repo.startswith("oci://")

    @property
    def from_source(self) -> bool:
        return self.source_path is not None

    @property
    def reference(self) -> str:
        """What `helm install` takes: the chart's name in a classic repository, its URL in OCI."""
        return f"{self.repo}/{self.name}" if self.is_oci else self.name

    @property
    def source_archive_url(self) -> str:
        """The tarball of the source repository at the chart's tag (GitHub's archive URL)."""
        return f"{self.repo}/archive/refs/tags/v{self.version}.tar.gz"

    @property
    def archive(self) -> str:
        """The archive's file name, as `helm pull` writes it (the chart cache's names)."""
        return f"{self.name}-{self.version}.tgz"


NVIDIA_DEVICE_PLUGIN = HelmChart(
    name="nvidia-device-plugin",
    repo="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",
    sha256=(
        "9e5642bcdd3805c6e931f9d3ca542677d1f714d68c14c1364892011e67d9a606",  # the repository's
        "e840c11caecb3266c81e8fb3daf165255fd7c11130abaafe68d285d1035c4af6",  # from source
    ),
)
KUBE_PROMETHEUS_STACK = HelmChart(
    name="kube-prometheus-stack",
    repo="https://prometheus-community.github.io/helm-charts",
    version="88.5.3",  # prometheus-operator v0.93.1, grafana chart 12.11.1
    sha256=("fe6fe2c2446f491136f8ed671f08e504677918bd140927243c1239f62fc021de",),  # from source
)
DCGM_EXPORTER = HelmChart(
    name="dcgm-exporter",
    repo="https://nvidia.github.io/dcgm-exporter/helm-charts",
    version="4.8.2",
    sha256=(
        "1c5535c03ebab3f021444df6016fce1cd7871385122e115c6ed24c804b623803",  # the repository's
        "e23b113d622056e822605500ce383739a1a0b13481139a7bf7981f809372cd37",  # from source
    ),
)
PROMETHEUS_ADAPTER = HelmChart(
    name="prometheus-adapter",
    repo="https://prometheus-community.github.io/helm-charts",
    version="5.3.0",
    sha256=("4ec3c4bb6218bd0cb62f466e6ea4d507c93d086570d68ad3001645d658b8571e",),  # from source
)
KEDA = HelmChart(
    name="keda",
    repo="https://kedacore.github.io/charts",
    version="2.20.2",  # its CRDs are templates: installed and upgraded with the release
    sha256=(
        "db60b1fa60f0565fefa4ce2f87e855b6a8854363ee82962fbe28a12a70d64c4c",  # the repository's
        "e0607f92d67cd09191549ea25248840c91171ab7e8d2e3ead114fc88e9d3c0b4",  # from source
    ),
)
# Karpenter's OCI charts: the CRDs in a chart of their own, so that upgrades update them (Helm
# never upgrades a chart's crds/ folder); the controller's chart is installed without its crds/.
KARPENTER_CRD = HelmChart(
    name="karpenter-crd",
    repo="oci://public.ecr.aws/karpenter",
    version="1.14.1",
    sha256=("9e83d81bc3152c51f34165ba46f5ec5d7887c97ab6cc784086b2bf893845edec",),  # from source
)
KARPENTER = HelmChart(
    name="karpenter",
    repo="oci://public.ecr.aws/karpenter",
    version="1.14.1",
    sha256=("c6011b0cccac31859a5261f28bc3d6e105a5410f9207a577aab37eb249d237fc",),  # from source
)
# AWS' EFA device plugin (vpc.amazonaws.com/efa on EFA nodes), installed where a GPU pool uses EFA.
EFA_DEVICE_PLUGIN = HelmChart(
    name="aws-efa-k8s-device-plugin",
    repo="https://aws.github.io/eks-charts",
    version="v0.5.30",  # plugin v0.5.20
    sha256=("43b3d666f81a40b7f7ac88ee04a64954abaaa061b1e5f54dc7ce4beb3374e32a",),  # the repo's
)

# The profiler's store: the CloudNativePG operator (its CRDs are templates of the chart, so they
# are upgraded with it) and, on clusters without a storage provisioner, local-path-provisioner,
# which Rancher publishes only as a folder of its repository.
CLOUDNATIVE_PG = HelmChart(
    name="cloudnative-pg",
    repo="https://cloudnative-pg.github.io/charts",
    version="0.29.0",  # operator 1.30.0
    sha256=("29ee84320e06c847105849eba755187bc4ec0c895b861e8425216edb84efc84a",),  # from source
)
LOCAL_PATH_PROVISIONER = HelmChart(
    name="local-path-provisioner",
    repo="https://github.com/rancher/local-path-provisioner",
    version="0.0.37",
    source_path="deploy/chart/local-path-provisioner",
    sha256=("d3802ddf36d6107466394b5cd0303ef0439941f11f93a41ec79e766d5a5d045a",),  # from source
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
    LOCAL_PATH_PROVISIONER,
    EFA_DEVICE_PLUGIN,
)

# Images by the digest of their multi-arch index, the tag kept for people to read; where no
# digest is known, the reason instead (a pin by digest must be one that was checked). The digests
# were taken from public repositories that pin the same tag, and agree, not resolved from a
# registry here; `docker buildx imagetools inspect IMAGE` confirms one (docs/operations.md,
# "Supply chain"). tests/infra/test_versions.py fails on an image of this file missing here.
IMAGE_DIGESTS: dict[str, tuple[str | None, str]] = {
    "vllm/vllm-openai:v0.11.0": (
        "sha256:014a95f21c9edf6abe0aea6b07353f96baa4ec291c427bb1176dc7c93a85845c",
        "four public records agree",
    ),
    "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless": (
        "sha256:60d3b00ac80b4ae77f94dae2f943685605585ad9e92fdccda3154d009ae317cc",
        "several public records agree",
    ),
    "ghcr.io/cloudnative-pg/pgbouncer:1.25.1": (
        "sha256:e6ddfe22d845e603825e235dd8334b21ecd125abea2a2172478f556b8dee2bb8",
        "one public record",
    ),
    "ghcr.io/cloudnative-pg/postgresql:18.4-system-trixie": (
        None,
        "unknown: CloudNativePG rebuilds this tag for OS fixes, and public records name four "
        "different digests",
    ),
    "docker.io/library/busybox:1.37.0": (
        None,
        "unknown: the tag was republished, and public records name several digests",
    ),
    "public.ecr.aws/aws-cli/aws-cli:2.32.9": (
        None,
        "unknown: no public record of this registry's digest (Docker Hub's copy is another push)",
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
# so that an operator upgrade does not roll the database by itself. The local-path helper (it
# creates and removes volume folders on the node) is pinned instead of the chart's busybox:latest.
POSTGRESQL_IMAGE = pinned("ghcr.io/cloudnative-pg/postgresql:18.4-system-trixie")
PGBOUNCER_IMAGE = pinned("ghcr.io/cloudnative-pg/pgbouncer:1.25.1")
LOCAL_PATH_HELPER_IMAGE = ("docker.io/library/busybox", "1.37.0")
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
