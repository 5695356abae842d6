"""The ``scalers`` check: every ScaledObject and HPA scales a workload of the stack; Prometheus
triggers name a server (resolved by ``references``) and a query."""

from __future__ import annotations

from infra.render.graph import ObjectGraph


def scaler_findings(graph: ObjectGraph) -> list[str]:
    """KEDA ScaledObjects and HPAs scale a workload the stack creates, on a query KEDA can run."""
    findings = []
    for scaler in graph.of_kind("ScaledObject", "HorizontalPodAutoscaler"):
        spec = scaler.manifest.get("spec") or {}
        target = spec.get("scaleTargetRef") or {}
        kind = target.get("kind") or "Deployment"
        if graph.find(kind, str(target.get("name")), scaler.namespace) is None:
            findings.append(
                f"{scaler}: scales {kind} {scaler.namespace}/{target.get('name')}, which the "
                f"stack does not create"
            )
        for index, trigger in enumerate(spec.get("triggers") or ()):
            metadata = trigger.get("metadata") or {}
            if trigger.get("type") == "prometheus" and not (
                metadata.get("serverAddress") and metadata.get("query")
            ):
                findings.append(f"{scaler}: trigger {index} needs serverAddress and query")
    return findings
