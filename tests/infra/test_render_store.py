"""The profiler's store in the rendered graph of both stacks, and the checks that guard it.

Test doubles as in test_render.py: the stack programs under Pulumi's mock engine, the pinned
charts (the CloudNativePG operator with its CRDs; local-path-provisioner is plain objects) rendered
by Helm's own engine, schema validation instead of an API server, and the operator's pods,
Services and volume claims modelled from its source (infra/render/cnpg.py). Each check passes on
the stacks as shipped (test_render.py's test_every_check_passes) and fails here, naming the
object, on the defect it is there to catch.
"""

from __future__ import annotations

import copy

import yaml

from infra.render.checks.objects import workloads
from infra.render.checks.scheduling import volume_claims
from infra.render.graph import K8sObject, ObjectGraph
from infra.scheduling import NodePool, Taint
from tests.infra.render_support import check


def find(graph: ObjectGraph, kind: str, name: str, namespace: str | None = None) -> K8sObject:
    found = graph.find(kind, name, namespace)
    assert found is not None, f"{kind} {namespace}/{name}"
    return found


def test_the_database_objects_are_valid_for_the_operators_own_crds(eks_graph: ObjectGraph) -> None:
    crds = {o.name for o in eks_graph.of_kind("CustomResourceDefinition")}
    assert {"clusters.postgresql.cnpg.io", "poolers.postgresql.cnpg.io"} <= crds
    assert check(eks_graph, "schema") == []
    graph = copy.deepcopy(eks_graph)
    find(graph, "Cluster", "gpu-profiler-store").manifest["spec"]["instance"] = 2
    pooler = find(graph, "Pooler", "gpu-profiler-store-pooler")
    pooler.manifest["spec"]["pgbouncer"]["poolMode"] = "statement"
    findings = {line.split(" (")[0]: line for line in check(graph, "schema")}
    assert set(findings) == {
        "Cluster gpu-profiler-store/gpu-profiler-store",
        "Pooler gpu-profiler-store/gpu-profiler-store-pooler",
    }
    assert "'instance' was unexpected" in findings["Cluster gpu-profiler-store/gpu-profiler-store"]
    assert (
        "'statement' is not one of ['session', 'transaction']"
        in (findings["Pooler gpu-profiler-store/gpu-profiler-store-pooler"])
    )


def test_the_operator_and_the_database_are_scraped(eks_graph: ObjectGraph) -> None:
    monitors = {(o.namespace, o.name) for o in eks_graph.of_kind("PodMonitor")}
    assert {
        ("cnpg-system", "cloudnative-pg"),  # the operator's, from its chart
        ("gpu-profiler-store", "gpu-profiler-store"),
        ("gpu-profiler-store", "gpu-profiler-store-pooler"),
    } <= monitors
    assert check(eks_graph, "monitoring") == []
    graph = copy.deepcopy(eks_graph)
    pooler = find(graph, "PodMonitor", "gpu-profiler-store-pooler")
    pooler.manifest["spec"]["podMetricsEndpoints"][0]["port"] = "http-metrics"
    operator = find(graph, "PodMonitor", "cloudnative-pg")
    operator.manifest["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "cnpg"
    assert sorted(check(graph, "monitoring")) == [
        "PodMonitor cnpg-system/cloudnative-pg (helm/cloudnative-pg): selects no pods",
        "PodMonitor gpu-profiler-store/gpu-profiler-store-pooler (profiler-store): no selected "
        "pod has a port named http-metrics",
    ]


def test_the_database_pods_are_scheduled_like_any_workload(kubeadm_graph: ObjectGraph) -> None:
    owners = {str(w.owner).split(" (")[0] for w in workloads(kubeadm_graph)}
    assert {
        "Cluster gpu-profiler-store/gpu-profiler-store",
        "Pooler gpu-profiler-store/gpu-profiler-store-pooler",
        "Deployment cnpg-system/cloudnative-pg",
        "Deployment local-path-storage/local-path-provisioner",
    } <= owners
    graph = copy.deepcopy(kubeadm_graph)
    graph.platform.pools = [
        NodePool(p.name, p.labels, (*p.taints, Taint("dedicated", "NoSchedule", "batch")), p.size)
        for p in graph.platform.pools
    ]
    stuck = {line.split(" (")[0] for line in check(graph, "scheduling")}
    assert {
        "Cluster gpu-profiler-store/gpu-profiler-store",
        "Pooler gpu-profiler-store/gpu-profiler-store-pooler",
    } <= stuck


def test_every_volume_claim_has_a_storage_class(
    eks_graph: ObjectGraph, kubeadm_graph: ObjectGraph
) -> None:
    claims = {(str(o).split(" (")[0], what, c) for o, what, c in volume_claims(eks_graph)}
    assert claims == {
        ("Prometheus monitoring/kube-prometheus-stack-prometheus", "storage", "gp3-encrypted"),
        ("Cluster gpu-profiler-store/gpu-profiler-store", "storage", "gp3-encrypted"),
    }
    kubeadm_claims = {(str(o).split(" (")[0], c) for o, _, c in volume_claims(kubeadm_graph)}
    assert kubeadm_claims == {("Cluster gpu-profiler-store/gpu-profiler-store", "local-path")}
    local_path = find(kubeadm_graph, "StorageClass", "local-path")
    assert not local_path.source.startswith("helm/")  # its release manifest's objects
    assert local_path.manifest["volumeBindingMode"] == "WaitForFirstConsumer"

    graph = copy.deepcopy(kubeadm_graph)
    graph.objects.remove(find(graph, "StorageClass", "local-path"))
    assert check(graph, "scheduling") == [
        "Cluster gpu-profiler-store/gpu-profiler-store (profiler-store): storage: StorageClass "
        "local-path is neither created by the stack nor said to exist "
        "(render --assume-storage-class); its volume would stay Pending"
    ]
    graph.platform.storage_classes = frozenset({"local-path"})  # a class the cluster has
    assert check(graph, "scheduling") == []
    del find(graph, "Cluster", "gpu-profiler-store").manifest["spec"]["storage"]["storageClass"]
    assert check(graph, "scheduling") == [
        "Cluster gpu-profiler-store/gpu-profiler-store (profiler-store): storage: names no "
        "StorageClass and the cluster has no default one; its volume would stay Pending"
    ]


def test_references_follow_the_store_wiring(eks_graph: ObjectGraph) -> None:
    assert check(eks_graph, "references") == []
    graph = copy.deepcopy(eks_graph)
    daemon = find(graph, "DaemonSet", "gpu-profiler")
    (container,) = daemon.manifest["spec"]["template"]["spec"]["containers"]
    for env in container["env"]:
        if env["name"] == "GPU_PROFILER_STORE_URL":
            env["value"] = (
                env["value"].replace("store-pooler.", "store-rw.").replace(":5432", ":6432")
            )
    graph.objects.remove(find(graph, "Secret", "gpu-profiler-store", "gpu-profiler"))
    server_ca = find(graph, "Secret", "gpu-profiler-store-server-ca")
    del server_ca.manifest["stringData"]["ca.key"]
    pooler = find(graph, "Pooler", "gpu-profiler-store-pooler")
    pooler.manifest["spec"]["cluster"]["name"] = "gpu-profiler-db"
    assert sorted(check(graph, "references")) == [
        "Cluster gpu-profiler-store/gpu-profiler-store (profiler-store): "
        "certificates.serverCASecret: Secret gpu-profiler-store-server-ca has no key ca.key",
        "DaemonSet gpu-profiler/gpu-profiler (gpu-profiler): container gpu-profiler env "
        "GPU_PROFILER_STORE_URL: gpu-profiler-store-rw.gpu-profiler-store.svc:6432: Service "
        "gpu-profiler-store/gpu-profiler-store-rw has no port 6432",
        "DaemonSet gpu-profiler/gpu-profiler (gpu-profiler): volume store-credentials: no "
        "Secret gpu-profiler/gpu-profiler-store",
        "Pooler gpu-profiler-store/gpu-profiler-store-pooler (profiler-store): spec.cluster "
        "gpu-profiler-store/gpu-profiler-db is no Cluster of the stack",
    ]


def test_grafana_data_source_wiring(eks_graph: ObjectGraph) -> None:
    assert check(eks_graph, "grafana") == []
    graph = copy.deepcopy(eks_graph)
    grafana = find(graph, "Deployment", "kube-prometheus-stack-grafana")
    (main,) = [
        c
        for c in grafana.manifest["spec"]["template"]["spec"]["containers"]
        if c["name"] == "grafana"
    ]
    main["env"] = [e for e in main["env"] if e["name"] != "GPU_PROFILER_STORE_PASSWORD"]
    source = find(graph, "ConfigMap", "grafana-datasource-gpu-profiler-store")
    document = yaml.safe_load(source.manifest["data"]["gpu-profiler-store.yaml"])
    document["datasources"][0]["jsonData"]["sslRootCertFile"] = "/etc/grafana/ssl/ca.crt"
    source.manifest["data"]["gpu-profiler-store.yaml"] = yaml.safe_dump(document)
    prefix = (
        "ConfigMap monitoring/grafana-datasource-gpu-profiler-store (gpu-platform): data source "
        "gpu-profiler-store: "
    )
    assert sorted(check(graph, "grafana")) == [
        prefix + "Grafana has no environment variable GPU_PROFILER_STORE_PASSWORD",
        prefix + "sslRootCertFile /etc/grafana/ssl/ca.crt: no ConfigMap or Secret is mounted there",
    ]
    source.metadata["labels"] = {}
    assert check(graph, "grafana") == [
        "ConfigMap monitoring/grafana-datasource-gpu-profiler-store (gpu-platform): data sources "
        "without the sidecar's label grafana_datasource=1"
    ]


def test_verify_full_needs_the_pooler_among_the_certificate_names(eks_graph: ObjectGraph) -> None:
    """CloudNativePG's server certificate names the Cluster's own Services only; the pooler serves
    the same certificate, so a client verifying the pooler's name fails unless the Cluster adds it
    (certificates.serverAltDNSNames)."""
    graph = copy.deepcopy(eks_graph)
    find(graph, "Cluster", "gpu-profiler-store").manifest["spec"]["certificates"][
        "serverAltDNSNames"
    ] = []
    findings = check(graph, "references") + check(graph, "grafana")
    assert [line.split(": sslmode")[0] for line in findings] == [
        "DaemonSet gpu-profiler/gpu-profiler (gpu-profiler): container gpu-profiler env "
        "GPU_PROFILER_STORE_URL",
        "ConfigMap monitoring/grafana-datasource-gpu-profiler-store (gpu-platform): data source "
        "gpu-profiler-store",
    ]
    assert all(
        "sslmode=verify-full to gpu-profiler-store-pooler.gpu-profiler-store.svc, which is not "
        "among the server certificate's names (gpu-profiler-store-rw, " in line
        for line in findings
    )
