"""GpuProfiler: the gpu-profiler DaemonSet on every GPU node, with least-privilege RBAC.

The daemon reads its node's GPU series from Prometheus, annotates the node and its GPU pods, serves
its own metrics on port 9401 and writes its table store: the stack's PostgreSQL (CloudNativePG or
RDS), a database given by URL, or a SQLite file on each node (``infra/store/daemon.py``).

Training protection's marks do not outlive the profiler's wish for them: with
``protect_training`` off the daemons run ``--protect-training=release`` (each removes the marks
it set on its node within a cycle), and ``pulumi destroy`` of the component, given the
cluster's kubeconfig, runs ``gpu-profiler unprotect`` (``infra.unprotect_run``) on the machine
running Pulumi once the DaemonSet and its pods are gone: the DaemonSet depends on that command,
so it is deleted first, in the foreground (its deletion ends when its pods have).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_kubernetes as k8s

from infra import versions
from infra.admission import admission_objects, profiler_policy, store_namespace_policy
from infra.gpu import gpu_node_selector, gpu_tolerations
from infra.platform import PROMETHEUS_PORT, namespace_name
from infra.security import non_root_pod_security
from infra.store.daemon import SQLITE_INIT_CAPABILITIES, daemon_store, pod_security_labels
from infra.store.endpoint import PostgresStore, ProfilerStore, SqliteStore
from infra.unprotect_run import ENV_ANNOTATION_DOMAIN, ENV_KUBECONFIG
from profiler_app.core.annotations import DEFAULT_DOMAIN

PROFILER_NAME = "gpu-profiler"  # also the `job` label of its series
METRICS_PORT = 9401
RUN_AS_USER = 65532  # the image's non-root user
STORE_DIR = "/var/lib/gpu-profiler"  # the image's store folder; SQLite's, on the node too
PULL_SECRET_NAME = f"{PROFILER_NAME}-registry"  # the Secret of ``registry_credentials``
# SIGTERM to SIGKILL. The daemon needs a few seconds (profiler_app.daemon.STOP_GRACE_SECONDS
# for a running cycle, then the store's flush); Kubernetes' default is the same 30 s, set here
# so the code and its comments do not rest on an unstated default.
TERMINATION_GRACE_SECONDS = 30
REPO_ROOT = Path(__file__).resolve().parents[1]
# pulumi-kubernetes' delete waits for the object to go; in the foreground, the DaemonSet goes
# only once its pods have, so nothing can set a mark after `gpu-profiler unprotect` ran.
LINK_LOCAL = "169.254.0.0/16"  # the instance metadata service: never the profiler's to reach
DELETION_PROPAGATION = {"pulumi.com/deletionPropagationPolicy": "foreground"}

# The profiler's series: namespace/pod name the GPU's workload, so the target's own (the profiler
# pod's) are dropped and unallocated GPUs stay unlabelled; Hostname (GPU series, as dcgm-exporter
# names it) and node (pod series) are the node the target runs on, whatever the series say.
NODE_LABELS = ("Hostname", "node")
SCRAPE_RELABELINGS: list[dict[str, Any]] = [
    {"action": "labeldrop", "regex": "^(namespace|pod|container)$"},
    *(
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": label}
        for label in NODE_LABELS
    ),
]
METRIC_RELABELINGS: list[dict[str, Any]] = [
    {"sourceLabels": ["__name__"], "regex": "gpu_profiler_.*", "action": "keep"},
    # Every target label (job, instance, service, endpoint, the node labels) a series sent
    # lands in exported_* (Prometheus scrape/scrape.go, mutateSampleLabels): none is kept.
    {"action": "labeldrop", "regex": "^exported_.+$"},
]

# Everything the profiler may do with the Kubernetes API: annotate its node and the pods on it.
RBAC_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nodes", ("get", "patch")),
    ("pods", ("get", "list", "watch", "patch")),
)


@dataclass(frozen=True)
class GpuProfilerArgs:
    """Knobs of the profiler DaemonSet."""

    prometheus_url: pulumi.Input[str]
    image: str = versions.PROFILER_IMAGE
    namespace: str = PROFILER_NAME
    store: ProfilerStore = field(default_factory=SqliteStore)
    annotation_domain: str = DEFAULT_DOMAIN
    interval: str = "30s"
    window: str = "30m"
    log_level: str = "info"
    # karpenter.sh/do-not-disrupt on pods while their GPUs train (pods patch, already granted);
    # off: the daemons release the marks they set (--protect-training=release).
    protect_training: bool = True
    # The cluster's kubeconfig (a secret): with it, `pulumi destroy` runs `gpu-profiler
    # unprotect` from the machine running Pulumi after the DaemonSet is gone.
    kubeconfig: pulumi.Input[str] | None = None
    # Only pods in this namespace may reach the metrics port (Prometheus runs there).
    monitoring_namespace: str = "monitoring"
    cpu_request: str = "50m"
    memory_request: str = "128Mi"
    cpu_limit: str = "500m"
    memory_limit: str = "512Mi"
    # A private registry (GHCR makes a new package private): names of existing pull Secrets in
    # the profiler's namespace, and/or a .dockerconfigjson (a Pulumi secret) the component stores
    # in a Secret of its own.
    image_pull_secrets: tuple[str, ...] = ()
    # The port of a store given by URL (``UrlStore``), which the egress NetworkPolicy opens.
    store_port: int = 5432
    registry_credentials: pulumi.Input[str] | None = None


def _env(args: GpuProfilerArgs) -> list[k8s.core.v1.EnvVarArgs]:
    plain = {
        "GPU_PROFILER_PROMETHEUS_URL": args.prometheus_url,
        "GPU_PROFILER_NODE_LABEL": versions.DCGM_NODE_LABEL,  # the node name on DCGM series
        "GPU_PROFILER_METRICS_ADDRESS": "0.0.0.0",  # noqa: S104  reached through the pod IP only
        "GPU_PROFILER_METRICS_PORT": str(METRICS_PORT),
        "GPU_PROFILER_ANNOTATION_DOMAIN": args.annotation_domain,
        "GPU_PROFILER_INTERVAL": args.interval,
        "GPU_PROFILER_WINDOW": args.window,
        "GPU_PROFILER_LOG_LEVEL": args.log_level,
        "GPU_PROFILER_PROTECT_TRAINING": "true" if args.protect_training else "release",
    }
    return [
        k8s.core.v1.EnvVarArgs(
            name="NODE_NAME",
            value_from=k8s.core.v1.EnvVarSourceArgs(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")
            ),
        ),
        *(k8s.core.v1.EnvVarArgs(name=key, value=value) for key, value in plain.items()),
    ]


def _health_probe(initial_delay: int, period: int) -> k8s.core.v1.ProbeArgs:
    return k8s.core.v1.ProbeArgs(
        http_get=k8s.core.v1.HTTPGetActionArgs(path="/healthz", port="metrics"),
        initial_delay_seconds=initial_delay,
        period_seconds=period,
        timeout_seconds=5,
        failure_threshold=3,
    )


class GpuProfiler(pulumi.ComponentResource):
    """The profiler DaemonSet, its ServiceAccount and RBAC, metrics Service and ServiceMonitor."""

    namespace: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: GpuProfilerArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu-cluster:index:GpuProfiler", name, None, opts)
        labels = {"app.kubernetes.io/name": PROFILER_NAME}

        ns = k8s.core.v1.Namespace(
            "profiler-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.namespace,
                labels=pod_security_labels(args.store),
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        namespace = namespace_name(ns)
        child = pulumi.ResourceOptions(parent=self, depends_on=[ns])

        def meta(object_name: str = PROFILER_NAME) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace, labels=labels)

        account = k8s.core.v1.ServiceAccount(
            "profiler-service-account", metadata=meta(), opts=child
        )
        self.cluster_role = k8s.rbac.v1.ClusterRole(
            "profiler-cluster-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=PROFILER_NAME, labels=labels),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=[resource], verbs=list(verbs))
                for resource, verbs in RBAC_RULES
            ],
            opts=pulumi.ResourceOptions(parent=self),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            "profiler-cluster-role-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=PROFILER_NAME, labels=labels),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=PROFILER_NAME
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(
                    kind="ServiceAccount", name=PROFILER_NAME, namespace=namespace
                )
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.cluster_role, account]),
        )
        # What the API server holds the ServiceAccount to: its own node and that node's pods,
        # annotations under the domain and do-not-disrupt only (infra/admission.py).
        self.admission = admission_objects(
            profiler_policy(args.namespace, PROFILER_NAME, args.annotation_domain),
            labels,
            pulumi.ResourceOptions(parent=self),
        )
        if isinstance(args.store, SqliteStore):
            # The namespace is `privileged` for the store's hostPath: this policy narrows it back.
            self.admission = [
                *self.admission,
                *admission_objects(
                    store_namespace_policy(args.namespace, STORE_DIR, SQLITE_INIT_CAPABILITIES),
                    labels,
                    pulumi.ResourceOptions(parent=self, depends_on=[ns]),
                ),
            ]

        store = daemon_store(
            args.store,
            namespace,
            labels=labels,
            sqlite_dir=STORE_DIR,
            user=RUN_AS_USER,
            image=args.image,
            opts=child,
        )

        pull_secrets = [
            k8s.core.v1.LocalObjectReferenceArgs(name=n) for n in args.image_pull_secrets
        ]
        if args.registry_credentials is not None:
            registry = k8s.core.v1.Secret(
                "profiler-registry-secret",
                metadata=meta(PULL_SECRET_NAME),
                type="kubernetes.io/dockerconfigjson",
                string_data={".dockerconfigjson": pulumi.Output.secret(args.registry_credentials)},
                opts=child,
            )
            pull_secrets.append(
                k8s.core.v1.LocalObjectReferenceArgs(
                    name=registry.metadata.apply(lambda m: str(m.name))
                )
            )

        container = k8s.core.v1.ContainerArgs(
            name=PROFILER_NAME,
            image=args.image,
            command=["gpu-profiler", "run"],
            env=[*_env(args), *store.env],
            ports=[
                k8s.core.v1.ContainerPortArgs(
                    name="metrics", container_port=METRICS_PORT, protocol="TCP"
                )
            ],
            liveness_probe=_health_probe(initial_delay=30, period=30),
            readiness_probe=_health_probe(initial_delay=5, period=10),
            resources=k8s.core.v1.ResourceRequirementsArgs(
                requests={"cpu": args.cpu_request, "memory": args.memory_request},
                limits={"cpu": args.cpu_limit, "memory": args.memory_limit},
            ),
            security_context=k8s.core.v1.SecurityContextArgs(
                allow_privilege_escalation=False,
                read_only_root_filesystem=True,
                run_as_non_root=True,
                run_as_user=RUN_AS_USER,
                run_as_group=RUN_AS_USER,
                capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
                seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
            ),
            volume_mounts=[
                *store.mounts,
                k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),  # noqa: S108
            ],
        )
        self.unprotect_on_destroy = _unprotect_on_destroy(args, self)
        self.daemon_set = k8s.apps.v1.DaemonSet(
            "profiler-daemon-set",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=PROFILER_NAME,
                namespace=namespace,
                labels=labels,
                annotations=DELETION_PROPAGATION,
            ),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=k8s.apps.v1.RollingUpdateDaemonSetArgs(max_unavailable="25%"),
                ),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=labels, annotations=store.pod_annotations or None
                    ),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=PROFILER_NAME,
                        termination_grace_period_seconds=TERMINATION_GRACE_SECONDS,
                        node_selector=gpu_node_selector(),
                        tolerations=[
                            k8s.core.v1.TolerationArgs(
                                key=toleration["key"],
                                operator=toleration["operator"],
                                effect=toleration["effect"],
                            )
                            for toleration in gpu_tolerations()
                        ],
                        security_context=non_root_pod_security(RUN_AS_USER),
                        init_containers=store.init_containers or None,
                        image_pull_secrets=pull_secrets or None,
                        containers=[container],
                        volumes=[
                            *store.volumes,
                            k8s.core.v1.VolumeArgs(
                                name="tmp",
                                empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="64Mi"),
                            ),
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[ns, account, *self.admission, *store.objects]
                + ([self.unprotect_on_destroy] if self.unprotect_on_destroy else []),
            ),
        )

        self.service = k8s.core.v1.Service(
            "profiler-metrics-service",
            metadata=meta(),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None",
                selector=labels,
                ports=[
                    k8s.core.v1.ServicePortArgs(
                        name="metrics", port=METRICS_PORT, target_port="metrics", protocol="TCP"
                    )
                ],
            ),
            opts=child,
        )
        self.service_monitor = k8s.apiextensions.CustomResource(
            "profiler-service-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="ServiceMonitor",
            metadata=meta(),
            spec={
                "jobLabel": "app.kubernetes.io/name",
                "selector": {"matchLabels": labels},
                "namespaceSelector": {"matchNames": [args.namespace]},
                "endpoints": [
                    {
                        "port": "metrics",
                        "path": "/metrics",
                        "interval": "30s",
                        # A profiler speaks only for its own node's series: Prometheus sets
                        # job, instance and the node labels (a forged one lands in exported_*,
                        # dropped), and takes only gpu_profiler_* names from it.
                        "honorLabels": False,
                        "relabelings": SCRAPE_RELABELINGS,
                        "metricRelabelings": METRIC_RELABELINGS,
                    }
                ],
            },
            opts=child,
        )
        # Only Prometheus' namespace may reach the metrics port; kubelet probes are not affected.
        # Out: DNS, Prometheus, the API server and the store (_egress), nothing else.
        k8s.networking.v1.NetworkPolicy(
            "profiler-network-policy",
            metadata=meta(),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
                policy_types=["Ingress", "Egress"],
                egress=_egress(args),
                ingress=[
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        from_=[
                            k8s.networking.v1.NetworkPolicyPeerArgs(
                                namespace_selector=k8s.meta.v1.LabelSelectorArgs(
                                    match_labels={
                                        "kubernetes.io/metadata.name": args.monitoring_namespace
                                    }
                                )
                            )
                        ],
                        ports=[
                            k8s.networking.v1.NetworkPolicyPortArgs(
                                port=METRICS_PORT, protocol="TCP"
                            )
                        ],
                    )
                ],
            ),
            opts=child,
        )

        self.namespace = namespace
        self.register_outputs({"namespace": self.namespace})


def _tcp(*ports: int) -> list[k8s.networking.v1.NetworkPolicyPortArgs]:
    return [k8s.networking.v1.NetworkPolicyPortArgs(port=p, protocol="TCP") for p in ports]


def _egress(args: GpuProfilerArgs) -> list[k8s.networking.v1.NetworkPolicyEgressRuleArgs]:
    """Where the daemon connects. The API server's and an outside store's addresses are not known
    when rendering: those ports are open to any address but the link-local range (the instance
    metadata service); an in-cluster store (CloudNativePG's pooler) is a pod of any namespace."""

    def namespace(name: str) -> k8s.meta.v1.LabelSelectorArgs:
        return k8s.meta.v1.LabelSelectorArgs(match_labels={"kubernetes.io/metadata.name": name})

    anywhere = k8s.networking.v1.NetworkPolicyPeerArgs(
        ip_block=k8s.networking.v1.IPBlockArgs(cidr="0.0.0.0/0", except_=[LINK_LOCAL])
    )
    rules = [
        k8s.networking.v1.NetworkPolicyEgressRuleArgs(
            to=[
                k8s.networking.v1.NetworkPolicyPeerArgs(
                    namespace_selector=namespace("kube-system"),
                    pod_selector=k8s.meta.v1.LabelSelectorArgs(
                        match_labels={"k8s-app": "kube-dns"}
                    ),
                )
            ],
            ports=[
                k8s.networking.v1.NetworkPolicyPortArgs(port=53, protocol=protocol)
                for protocol in ("UDP", "TCP")
            ],
        ),
        k8s.networking.v1.NetworkPolicyEgressRuleArgs(
            to=[
                k8s.networking.v1.NetworkPolicyPeerArgs(
                    namespace_selector=namespace(args.monitoring_namespace)
                )
            ],
            ports=_tcp(PROMETHEUS_PORT),
        ),
        # The `kubernetes` Service's port, and the endpoints' (EKS: 443; kubeadm: 6443).
        k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=[anywhere], ports=_tcp(443, 6443)),
    ]
    if not isinstance(args.store, SqliteStore):
        port = (
            args.store.endpoint.port if isinstance(args.store, PostgresStore) else args.store_port
        )
        in_cluster = k8s.networking.v1.NetworkPolicyPeerArgs(
            namespace_selector=k8s.meta.v1.LabelSelectorArgs()
        )
        rules.append(
            k8s.networking.v1.NetworkPolicyEgressRuleArgs(
                to=[in_cluster, anywhere], ports=_tcp(port)
            )
        )
    return rules


def _unprotect_on_destroy(
    args: GpuProfilerArgs, parent: pulumi.Resource
) -> command.local.Command | None:
    """A command with nothing to do but on deletion: `gpu-profiler unprotect`, cluster-wide.
    None without a kubeconfig (then run it by hand after `pulumi destroy`)."""
    if args.kubeconfig is None:
        return None
    return command.local.Command(
        "profiler-unprotect",
        delete=f"{shlex.quote(sys.executable)} -m infra.unprotect_run",
        dir=str(REPO_ROOT),
        environment={
            ENV_KUBECONFIG: pulumi.Output.secret(args.kubeconfig),
            ENV_ANNOTATION_DOMAIN: args.annotation_domain,
        },
        opts=pulumi.ResourceOptions(parent=parent),
    )
