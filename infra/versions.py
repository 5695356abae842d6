"""Every chart, image and Kubernetes version the components install, pinned in one place.

Bump a version here, run ``pytest tests/infra`` and read the chart's changelog for renamed values.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HelmChart:
    """A chart in a Helm repository, at an exact version."""

    name: str
    repo: str
    version: str
    # A chart published in no Helm repository: its folder in ``repo``'s source archive at the tag
    # ``v<version>``. `python -m infra.render --pull-charts` packages it into the chart cache, and
    # the stack installs it from there.
    source_path: str | None = None

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


NVIDIA_DEVICE_PLUGIN = HelmChart(
    name="nvidia-device-plugin",
    repo="https://nvidia.github.io/k8s-device-plugin",
    version="0.20.0",
)
KUBE_PROMETHEUS_STACK = HelmChart(
    name="kube-prometheus-stack",
    repo="https://prometheus-community.github.io/helm-charts",
    version="88.5.3",  # prometheus-operator v0.93.1, grafana chart 12.11.1
)
DCGM_EXPORTER = HelmChart(
    name="dcgm-exporter",
    repo="https://nvidia.github.io/dcgm-exporter/helm-charts",
    version="4.8.2",
)
PROMETHEUS_ADAPTER = HelmChart(
    name="prometheus-adapter",
    repo="https://prometheus-community.github.io/helm-charts",
    version="5.3.0",
)
KEDA = HelmChart(
    name="keda",
    repo="https://kedacore.github.io/charts",
    version="2.20.2",  # its CRDs are templates: installed and upgraded with the release
)
# Karpenter's OCI charts: the CRDs in a chart of their own, so that upgrades update them (Helm
# never upgrades a chart's crds/ folder); the controller's chart is installed without its crds/.
KARPENTER_CRD = HelmChart(
    name="karpenter-crd",
    repo="oci://public.ecr.aws/karpenter",
    version="1.14.1",
)
KARPENTER = HelmChart(
    name="karpenter",
    repo="oci://public.ecr.aws/karpenter",
    version="1.14.1",
)

# The profiler's store: the CloudNativePG operator (its CRDs are templates of the chart, so they
# are upgraded with it) and, on clusters without a storage provisioner, local-path-provisioner,
# which Rancher publishes only as a folder of its repository.
CLOUDNATIVE_PG = HelmChart(
    name="cloudnative-pg",
    repo="https://cloudnative-pg.github.io/charts",
    version="0.29.0",  # operator 1.30.0
)
LOCAL_PATH_PROVISIONER = HelmChart(
    name="local-path-provisioner",
    repo="https://github.com/rancher/local-path-provisioner",
    version="0.0.37",
    source_path="deploy/chart/local-path-provisioner",
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
)

# The example GPU inference server (vLLM's OpenAI-compatible server; it exports request metrics
# on /metrics) and the small model it serves, which fits any NVIDIA GPU of the GPU pools.
EXAMPLE_INFERENCE_IMAGE = "vllm/vllm-openai:v0.11.0"
EXAMPLE_INFERENCE_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

# dcgm-exporter's image for chart 4.8.2 (DCGM 4.5.3); the chart's own default, pinned explicitly.
DCGM_EXPORTER_IMAGE_TAG = "4.5.3-4.8.2-distroless"
# The label naming the node on dcgm-exporter's series: "Hostname" up to this version ("hostname"
# later); the ServiceMonitor copies either into this one (platform.node_label_relabelings).
DCGM_NODE_LABEL = "Hostname"

# The profiler's image, as the release workflow publishes it: pushing the tag v<version> builds and
# pushes <repository>:<version>, <version> being pyproject.toml's project.version (a test checks
# that they agree). Stacks override it with config `profilerImage`.
PROFILER_IMAGE_REPOSITORY = "ghcr.io/centaurusinfra/gpu-profiler"
PROFILER_VERSION = "0.1.0"
PROFILER_IMAGE = f"{PROFILER_IMAGE_REPOSITORY}:{PROFILER_VERSION}"

# PostgreSQL and PgBouncer images of the CloudNativePG cluster: operator 1.30.0's defaults, pinned
# so that an operator upgrade does not roll the database by itself. The local-path helper (it
# creates and removes volume folders on the node) is pinned instead of the chart's busybox:latest.
POSTGRESQL_IMAGE = "ghcr.io/cloudnative-pg/postgresql:18.4-system-trixie"
PGBOUNCER_IMAGE = "ghcr.io/cloudnative-pg/pgbouncer:1.25.1"
LOCAL_PATH_HELPER_IMAGE = ("docker.io/library/busybox", "1.37.0")
# Amazon RDS for PostgreSQL (profilerStore: rds): the major version; RDS applies minor upgrades.
RDS_POSTGRESQL_VERSION = "18"
RDS_PARAMETER_GROUP_FAMILY = "postgres18"
# The AWS CLI that reads RDS's master secret in the store's bootstrap Job.
AWS_CLI_IMAGE = "public.ecr.aws/aws-cli/aws-cli:2.32.9"

# Kubernetes minor version of EKS clusters; also the schema version objects are validated against.
KUBERNETES_VERSION = "1.31"
